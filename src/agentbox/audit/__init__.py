"""The tamper-evident audit trail: the bottom floor that whoever records imports.

log.py   append-only JSONL with a hash chain: writer, reader, verify, follow
sink.py  the remote sink that ships records off the host
"""
