"""What crishim learns about the node it runs on, probed once at start."""
