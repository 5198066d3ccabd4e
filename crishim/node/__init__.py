"""The node: every store and manager built once, in order, with its collaborators handed
in (`daemon.Daemon`), started and recovered together at start-up and stopped in reverse.
Only the CRI servicers and the server entry point reach it.
"""
