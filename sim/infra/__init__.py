"""Infrastructure every layer may use: typed errors, crash-safe files and the cache folder, command-line plumbing, progress, HTML pages and the plot style. Imports nothing else of the project."""
