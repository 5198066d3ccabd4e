"""The process plumbing under every manager: how crishim starts and reaps child processes
(`spawn`, `posixspawn`), the priorities of its own threads and of what it starts
(`priority`), how the event loop watches children (`eventloop`), the one disk thread the
store hands work to (`pipeworker`), blocking clean-up deferred until a reply is out
(`afterreply`), the garbage collector's start-up freeze (`heap`) and the named crash points
the recovery tests kill the daemon at (`crashpoint`). Nothing here knows about pods,
containers or the CRI; every package above `host/` may use it.
"""
