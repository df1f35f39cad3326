"""`python -m headprobe ...` (the `headprobe` command), e.g. under torchrun:

torchrun --nproc_per_node 2 -m headprobe run --treebank en_ewt-ud-dev.conllu --out results/
"""

import sys

from headprobe.cli import main

if __name__ == "__main__":
    sys.exit(main())
