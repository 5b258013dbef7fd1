"""dsv41: serve DeepSeek-V4.1-Flash on DGX Spark nodes (vLLM tensor parallel over RoCE)."""
