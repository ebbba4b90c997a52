"""`python real/device_check.py`: the vLLM plugin's device code on a CUDA GPU without vLLM, one module per part.

  options    the run's settings (DeviceCheckOptions), validated once
  runner     the checks' registry, their time caps and the run (CheckTimeout, Outcome, CheckResult, run_checks)
  state      synthetic token histories and vLLM-shaped step inputs that drive real.vllm_plugin.hybrid.HybridDrafter
  kernels    (a) the n-gram kernels against the simulator's n-gram lookup
  equality   (b) the plugin's step on the device against the same step on the CPU
  sync       (c) no host synchronisation in the step
  timing     (d) the step's time and CUDA launch count at 1, 8, 32 and 256 requests
  graphs     (e) the step captured as a CUDA graph: replay against eager
  compiled   (f) `compile: true` (HybridSpecConfig.compile) on the device (informational: refused on CUDA)
  variants   (g) the skip, runcal and the plugin's step timers (StepClock), device against CPU
  watchdog   the hard stop a blocking CUDA call cannot hold up: a process that kills the run and writes its report
  versions   the hardware and software the report names at its top
  report     device_check.json and device_check.md
  main       the command's options and its run
"""
