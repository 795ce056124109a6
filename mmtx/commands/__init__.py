"""What each command-line app does once `mmtx.cli` has read its command line: `run(cfg)` in each."""

import mmtx.config_resolvers  # noqa: F401  (the ${mmtx.*} resolvers, for configs composed anywhere)
