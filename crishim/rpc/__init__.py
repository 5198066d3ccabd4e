"""gRPC served on the event loop itself: HTTP/2 framing and HPACK decoding of our own
(Huffman strings by the `hpack` package's table).

grpcio's server hands every call between its own threads and the event loop several
times; through a client that adds nothing, a do-nothing grpcio server answers a relist
after an idle second in about twice the time containerd's Go server takes. Here a
request is read, handled and answered in the loop's own callbacks: `frames` writes and
reads HTTP/2 frames and header fields, `hpackdecoder` reads request header blocks,
`connection` is one client connection (settings, flow control, streams), `server` holds
the methods and the listening socket.
"""
