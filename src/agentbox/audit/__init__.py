"""The tamper-evident audit trail: the bottom floor that whoever records imports.

chain.py   the record format and hash chain: canonical JSON, hashes, file layout, verify
reader.py  reading records from the end of the files, filters, following the log
log.py     AuditLog, the writer (append-only JSONL, rotation, head, fsync policy)
sink.py    the remote sink that ships records off the host
"""
