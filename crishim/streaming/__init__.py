"""Streaming exec/attach/port-forward: the HTTP server behind the CRI Exec/Attach/PortForward
URLs, speaking SPDY/3.1 (spdy.py) and WebSocket (websocket.py) for the Kubernetes
remotecommand (remotecommand.py) and port-forward (portforward.py) protocols.

server.StreamingServer hands out single-use URLs (tokens.py) and calls an
interface.ExecBackend; backend.ContainerBackend is the real one (runc exec, conmon attach,
netns dial). client.py is the client side, used by the tests.
"""
