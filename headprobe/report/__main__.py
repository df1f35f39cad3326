"""`python -m headprobe.report RESULTS_DIR [--out DIR]`."""

import sys

from headprobe.report import main_report

if __name__ == "__main__":
    sys.exit(main_report())
