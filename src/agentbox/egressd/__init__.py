"""The egress daemon (``python -m agentbox.egressd.daemon``): the process that runs the
``network`` library's proxy for every networked sandbox of a home. Outside that library
because it also reads the sandbox store, files approvals (mode ``ask``) and writes an
audit log: the library imports none of those.

daemon.py  the entry point: policy book from the store, the proxy, its audit log
ask.py     mode ``ask``: hold a connection to a new name until a person decides
"""
