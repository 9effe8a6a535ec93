"""``python -m nndoctor``."""

import sys

from nndoctor.cli import main

sys.exit(main())
