"""The screen's truth: the display's state read back after each display on/off.

core.py: sans I/O, from the sources' readings, the state asked and a monotonic clock,
when to read again and whether the state is confirmed (by what) or not (why), within a
bounded settle; sources.py: each source one bounded read (DRM in sysfs, X11 DPMS,
Wayland's outputs, HDMI-CEC); service.py: the shell that reads them when the core says.
"""
