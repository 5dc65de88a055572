"""The persistent upload queue: screenshots, log bundles and proof-of-play records.

schedule.py holds the rules (sans I/O), store.py the queue on the SD card (what may be
queued, what is dropped, what is due), spool.py the index of its files and the appends
to them, segments.py the bytes of those files, deadletter.py the reasons of items
dropped for good, migrate_sqlite.py the queue of earlier versions; worker.py is the thin
thread that sends, sender.py the HTTP request, link_sender.py the same over the live link.
"""
