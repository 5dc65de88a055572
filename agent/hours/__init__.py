"""Working hours: the display off and on by a weekly schedule in local time, offline.

rules.py: the schedule, parsed and asked, sans I/O; service.py: the thread that runs the
display commands when the wanted state changes, only on a clock it can trust.
"""
