"""What every part builds on: the data (findings, events, the stash, subscribers,
suppression, "is this the user's code?") and the engine (session, check registry,
code selection, configuration)."""
