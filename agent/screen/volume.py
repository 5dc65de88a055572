"""Where the screen's volume is set and read back: the sound server (PipeWire's wpctl,
PulseAudio's pactl) or ALSA's mixer (amixer); each through the program the operator
would use by hand, bounded (sources.Runner), its answer parsed strictly.

Each answers as the brightness means do (brightness.py): ``probe()`` "" or why not,
``set(level)`` "" or why not, ``read()`` (level, in its words) or (None, why).

- wpctl: ``wpctl set-volume @DEFAULT_AUDIO_SINK@ 0.40`` / ``get-volume`` ("Volume:
  0.40", " [MUTED]" where muted).
- pactl: ``pactl set-sink-volume @DEFAULT_SINK@ 40%`` / ``get-sink-volume`` (a
  percentage for each channel, their mean is the level).
- amixer: ``amixer sset CONTROL 40%`` / ``sget CONTROL`` ("[40%]" for each channel;
  the control's limits give its resolution).

The sound server is the one of the session that plays the content: the agent reaches
it through the environment it is given (``XDG_RUNTIME_DIR``, ``PULSE_SERVER``,
``PIPEWIRE_REMOTE``), in the C locale so that the numbers read the same everywhere.
"""
from __future__ import annotations

import re
import shutil
from typing import Callable

MAX_OUTPUT = 8192     # what is parsed of a program's answer
ENVIRONMENT = ("PATH", "HOME", "XDG_RUNTIME_DIR", "PULSE_SERVER", "PULSE_RUNTIME_PATH",
               "PIPEWIRE_REMOTE", "PIPEWIRE_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS",
               "ALSA_CONFIG_PATH")


def environment(environ: dict) -> dict:
    """What the sound programs run in: the agent's way to the session's sound server,
    and the C locale."""
    env = {k: environ[k] for k in ENVIRONMENT if k in environ}
    env.update(LC_ALL="C", LANG="C")
    return env


def _mean(percents: list[str]) -> float | None:
    values = [int(p) for p in percents[:32]]
    if not values or any(v > 1000 for v in values):
        return None
    return sum(values) / len(values) / 100.0


class _Program:
    """A sound program found on the PATH of the environment it runs in."""
    via = ""
    resolution = 0.01

    def __init__(self, run: Callable, env: dict):
        """``run(argv, env=)`` -> (stdout or None, why): sources.Runner, bounded."""
        self.run, self.env = run, dict(env)

    def _tool(self) -> str | None:
        return shutil.which(self.via, path=self.env.get("PATH"))

    def _ask(self, *args: str) -> tuple[str | None, str]:
        tool = self._tool()
        if tool is None:
            return None, f"{self.via} is not installed"
        out, why = self.run([tool, *args], env=self.env)
        if out is None or why:
            return None, why or f"{self.via} said nothing"
        return out[:MAX_OUTPUT].decode("utf-8", "replace"), ""

    def probe(self) -> str:
        level, said = self.read()
        return "" if level is not None else said

    def set(self, level: float) -> str:
        return self._ask(*self.set_args(level))[1]

    def read(self) -> tuple[float | None, str]:
        text, why = self._ask(*self.get_args())
        if text is None:
            return None, why
        return self.parse(text)

    def set_args(self, level: float) -> tuple: ...

    def get_args(self) -> tuple: ...

    def parse(self, text: str) -> tuple[float | None, str]: ...


class Wpctl(_Program):
    via = "wpctl"
    SINK = "@DEFAULT_AUDIO_SINK@"
    _VOLUME = re.compile(r"^Volume: (\d{1,2}\.\d{1,4})( \[MUTED\])?\s*$", re.MULTILINE)

    def set_args(self, level: float) -> tuple:
        return "set-volume", self.SINK, f"{level:.2f}"

    def get_args(self) -> tuple:
        return "get-volume", self.SINK

    def parse(self, text: str) -> tuple[float | None, str]:
        m = self._VOLUME.search(text)
        if m is None:
            return None, "wpctl gave no volume for the default sink"
        return float(m.group(1)), "wpctl (PipeWire)" + (", muted" if m.group(2) else "")


class Pactl(_Program):
    via = "pactl"
    SINK = "@DEFAULT_SINK@"

    def set_args(self, level: float) -> tuple:
        return "set-sink-volume", self.SINK, f"{round(level * 100)}%"

    def get_args(self) -> tuple:
        return "get-sink-volume", self.SINK

    def parse(self, text: str) -> tuple[float | None, str]:
        line = next((x for x in text.splitlines() if x.startswith("Volume:")), "")
        level = _mean(re.findall(r"/\s*(\d{1,4})%\s*/", line))
        if level is None:
            return None, "pactl gave no volume for the default sink"
        return level, "pactl (PulseAudio)"


class Amixer(_Program):
    via = "amixer"

    def __init__(self, run: Callable, env: dict, control: str = "Master"):
        super().__init__(run, env)
        self.control = control

    def set_args(self, level: float) -> tuple:
        return "sset", self.control, f"{round(level * 100)}%"

    def get_args(self) -> tuple:
        return "sget", self.control

    def parse(self, text: str) -> tuple[float | None, str]:
        playback = [x for x in text.splitlines()
                    if "Playback" in x and re.search(r"\[\d{1,4}%\]", x)]
        level = _mean([re.search(r"\[(\d{1,4})%\]", x).group(1) for x in playback])
        if level is None:
            return None, f"amixer gave no playback volume for {self.control}"
        limits = re.search(r"Limits: Playback (-?\d{1,7}) - (-?\d{1,7})", text)
        if limits and int(limits.group(2)) > int(limits.group(1)):
            self.resolution = max(0.01, 1.0 / (int(limits.group(2)) - int(limits.group(1))))
        muted = "[off]" in "".join(playback)
        return level, f"amixer {self.control} (ALSA)" + (", muted" if muted else "")
