"""Sandbox networking: name and address checks, the filtering egress proxy."""
