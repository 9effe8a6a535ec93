"""``python -m nndoctor.data PATH...`` — same as ``nndoctor data PATH...``."""

import sys

from nndoctor.data.cli import main

sys.exit(main())
