"""The screen's truth: the display's state read back after each display on/off.

core.py: sans I/O, from the sources' readings, the state asked and a monotonic clock,
when to read again and whether the state is confirmed (by what) or not (why), within a
bounded settle; sources.py: each source one bounded read (DRM in sysfs, X11 DPMS,
Wayland's outputs, HDMI-CEC); service.py: the shell that reads them when the core says.

Picture health: picture.py, sans I/O, judges a small grey thumbnail black, frozen or ok
on a monotonic clock; capture.py captures the screen with its platform's tool and shrinks
it with Pillow, in memory; watch.py, the thread that checks now and then.
"""
