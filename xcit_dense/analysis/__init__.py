"""Model analysis: FLOPs and parameters per part, attention maps, ONNX export."""
