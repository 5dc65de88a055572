"""Hardware and network events: display, power, network; and telemetry.

model.py: what an event is and how sysfs state becomes one (pure); debounce.py and
outbox.py: one event per settle window, kept until the server ACKs it (pure);
watcher.py: the udev/rtnetlink listener thread; telemetry.py: psutil figures.
"""
