"""``python -m nndoctor.commands.data PATH...`` — same as ``nndoctor data PATH...``."""

import sys

from nndoctor.commands.data.cli import main

sys.exit(main())
