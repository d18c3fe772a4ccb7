"""Generated protobuf and gRPC code (``make proto``); imports nothing of fedlink."""
