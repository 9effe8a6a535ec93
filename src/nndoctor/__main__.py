"""``python -m nndoctor``.

By the time this runs, ``nndoctor/__init__`` has already taken the working directory out of
``sys.path[0]`` (``nndoctor.run._startup``), so nndoctor's own imports cannot pick up a user's
``inspect.py``; the runner gives that slot to the script's folder before running it.
"""

import sys

from nndoctor.cli import main

sys.exit(main())
