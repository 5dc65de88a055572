"""The persistent upload queue: screenshots, log bundles and proof-of-play records.

schedule.py holds the rules (sans I/O), store.py the spool on the SD card, worker.py the thin
thread that sends, sender.py the HTTP request.
"""
