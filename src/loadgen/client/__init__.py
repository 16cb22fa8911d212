"""Talking to servers: transports (registry.py names them), the sans-io response parser and SSE
reader, one backend per server API, the /health /props /slots /metrics probe, and the server's
tokenizer. Imports core only.
"""
