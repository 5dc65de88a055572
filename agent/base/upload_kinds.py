"""The kinds of upload, here and nowhere else: the queue, the senders, the profiles,
the command line and the commands that queue their output all take them from here."""

SCREENSHOT, LOG, PROOF_OF_PLAY = "screenshot", "log", "proof-of-play"
# each with its rank when the queue is full: the lowest gives way first
KINDS = {SCREENSHOT: 0, LOG: 1, PROOF_OF_PLAY: 2}
