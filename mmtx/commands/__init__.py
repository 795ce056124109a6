"""What each command-line app does once `mmtx.cli` has read its command line: `run(cfg)` in each."""
