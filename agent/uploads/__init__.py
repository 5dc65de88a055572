"""The persistent upload queue: screenshots, log bundles and proof-of-play records.

schedule.py holds the rules (sans I/O), store.py the sqlite file, worker.py the thin
thread that sends, sender.py the HTTP request.
"""
