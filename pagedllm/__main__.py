"""`python -m pagedllm ...` is the `pagedllm` command."""

import sys

from pagedllm.entrypoints.cli import main

sys.exit(main())
