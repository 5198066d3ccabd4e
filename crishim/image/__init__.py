"""Image service internals: references, registry client, content store, safe unpack."""
