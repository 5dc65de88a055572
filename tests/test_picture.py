"""Picture health (agent/screen/picture.py, capture.py, watch.py): the judge on a fake
clock, and a real X server (Xvfb) showing real pictures drawn by xsetroot, captured by
ImageMagick's import and shrunk by Pillow: black, a dark scene with detail that is not,
a static board frozen only where content is declared to move, an animation ok, a
display off by schedule never captured and never black."""
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from agent.base.upload_kinds import SCREENSHOT
from agent.config.model import Commands, Screen as ScreenSection
from agent.runtime.threads import start_worker
from agent.screen import capture as capturing
from agent.screen.picture import (BLACK, DARK, FROZEN, OK, FAILURE_QUIET_S, Changed,
                                  CheckFailed, Checked, Dark, Failed, Judge, Measure, Picture,
                                  is_black, measure, same)
from agent.screen.watch import ABSENT_EVERY_S, BAD_EVERY_S, PictureWatch, from_config
from devtools.harness import REPO, wait_for

W, H = 64, 36


def commands(display_off_command=None) -> Commands:
    return Commands(frozenset(), None, None, display_off_command, 10.0)


def solid(level: int, w: int = W, h: int = H) -> Picture:
    return Picture(w, h, bytes([level]) * (w * h))


def squares(level: int, size: int = 8, w: int = W, h: int = H, shift: int = 0) -> Picture:
    """A dark ground with lit squares of ``size`` every 2*size pixels."""
    px = bytes(level if ((x + shift) // size) % 2 == 0 and (y // size) % 2 == 0 else 0
               for y in range(h) for x in range(w))
    return Picture(w, h, px)


def judge(**kw) -> Judge:
    args = dict(black_luma=16.0, black_contrast=4.0, content_moves=False, frozen_after_s=300.0)
    args.update(kw)
    return Judge(**args)


def look(j: Judge, picture: Picture, now: float) -> list:
    return j.handle(Checked(measure(picture), now))


# -- what a thumbnail measures ---------------------------------------------------------
def test_a_solid_picture_has_its_level_for_mean_no_contrast_and_no_edges():
    m = measure(solid(40))
    assert (m.mean, m.contrast, m.dhash) == (40.0, 0.0, 0)


def test_a_dark_picture_with_detail_has_contrast_and_its_hash_tells_it_from_a_shifted_one():
    m = measure(squares(32))
    assert m.mean < 16 and m.contrast > 10
    assert not same(m, measure(squares(32, shift=8)))
    assert same(m, measure(squares(32)))
    # the same scene at another size (the screen's mode changed) is another picture
    assert not same(measure(squares(32, size=16, w=128, h=72)), m)


def test_a_fade_is_movement_though_its_hash_stays_the_same():
    assert measure(solid(40)).dhash == measure(solid(60)).dhash
    assert not same(measure(solid(40)), measure(solid(60)))


def test_a_picture_whose_pixels_do_not_fill_it_is_refused():
    with pytest.raises(ValueError):
        measure(Picture(4, 4, b"\0" * 15))


# -- the judge, on a fake clock -----------------------------------------------------------
def test_the_first_ok_is_no_news_and_a_black_screen_is_told_once_then_its_end():
    j = judge()
    [first] = look(j, squares(200), 0.0)   # a quarter-odd of it lit: 20 of 36 rows, half
    assert first == Changed(OK, False, None, {"mean": 55.6, "contrast": 89.6, "bright": 200})
    [black] = look(j, solid(3), 60.0)
    assert (black.verdict, black.news, black.was) == (BLACK, True, OK)
    assert black.details == {"mean": 3.0, "contrast": 0.0, "bright": 3}
    assert look(j, solid(3), 120.0) == []   # still black: no storm
    assert look(j, solid(0), 180.0) == []
    [ok] = look(j, squares(200), 240.0)
    assert (ok.verdict, ok.news, ok.was) == (OK, True, BLACK)
    assert (j.verdict, j.since) == (OK, 240.0)


def test_a_screen_black_from_the_start_is_told():
    [black] = look(judge(), solid(0), 0.0)
    assert (black.verdict, black.news, black.was) == (BLACK, True, None)


def test_a_dark_night_scene_with_detail_is_not_black_nor_is_a_bright_flat_one():
    j = judge()
    [first] = look(j, squares(32), 0.0)        # mean about 8: below black_luma, with detail
    assert first.verdict == OK and first.details["mean"] < 16
    assert look(j, solid(120), 60.0) == []    # flat but lit (a white slide): ok
    [black] = look(j, solid(10), 120.0)       # dark and flat: black
    assert black.verdict == BLACK


def test_a_static_board_is_never_frozen_unless_its_content_is_declared_to_move():
    j = judge(content_moves=False, frozen_after_s=30)
    look(j, squares(200), 0.0)
    for now in range(60, 36000, 600):
        assert look(j, squares(200), float(now)) == []
    assert j.verdict == OK


def test_moving_content_that_keeps_the_same_picture_is_frozen_after_frozen_after_s():
    j = judge(content_moves=True, frozen_after_s=300)
    assert look(j, squares(200), 0.0)[0].verdict == OK
    assert look(j, squares(200), 60.0) == []
    assert look(j, squares(200), 299.0) == []
    [frozen] = look(j, squares(200), 300.0)
    assert (frozen.verdict, frozen.news, frozen.details["same_for_s"]) == (FROZEN, True, 300)
    assert look(j, squares(200), 360.0) == []
    [ok] = look(j, squares(200, shift=8), 420.0)   # it moved
    assert (ok.verdict, ok.news, ok.was) == (OK, True, FROZEN)
    assert j.still_for(450.0) == 30.0


def test_an_animation_is_never_frozen():
    j = judge(content_moves=True, frozen_after_s=30)
    for i in range(100):
        assert look(j, squares(200, shift=8 * (i % 2)), 20.0 * i) == [] or i == 0
    assert j.verdict == OK


def test_black_wins_over_frozen_and_frozen_follows_black_when_it_lights_up_unmoving():
    j = judge(content_moves=True, frozen_after_s=30)
    assert look(j, solid(0), 0.0)[0].verdict == BLACK
    assert look(j, solid(0), 60.0) == []
    # lit again, but the same picture from then on: frozen after 30 s of it
    assert look(j, squares(200), 120.0)[0].verdict == OK
    assert look(j, squares(200), 150.0)[0].verdict == FROZEN


def test_dark_is_no_event_restarts_the_frozen_timer_and_a_verdict_is_not_told_twice():
    j = judge(content_moves=True, frozen_after_s=100)
    look(j, solid(0), 0.0)
    [dark] = j.handle(Dark("off by working hours", 10.0))
    assert (dark.verdict, dark.news, dark.details) == (DARK, False, {"why": "off by working hours"})
    assert j.handle(Dark("off by working hours", 70.0)) == []
    [back] = look(j, solid(0), 80.0)       # still black after the night: heard, not news
    assert (back.verdict, back.news) == (BLACK, False)
    look(j, squares(200), 90.0)
    assert look(j, squares(200), 150.0) == []
    j.handle(Dark("turned off by a display command", 160.0))
    # the same picture before and after the dark: its time is counted from the display's return
    assert look(j, squares(200), 200.0)[0].verdict == OK
    assert look(j, squares(200), 299.0) == []
    assert look(j, squares(200), 300.0)[0].verdict == FROZEN


def test_capture_failures_are_counted_and_told_once_per_reason_at_most_once_an_hour():
    j = judge()
    look(j, squares(200), 0.0)
    assert j.handle(Failed("import exited 1: unable to open X server", 60.0)) == [
        CheckFailed("import exited 1: unable to open X server", 1)]
    assert j.handle(Failed("import exited 1: unable to open X server", 120.0)) == []
    assert j.handle(Failed("import timed out after 5 s", 180.0)) == []   # within the hour
    assert j.verdict == OK and j.failures == 3 and j.failure == "import timed out after 5 s"
    look(j, squares(200), 240.0)
    assert j.failure is None
    # a capture that flaps: quiet for the hour, then told again
    assert j.handle(Failed("import exited 1: unable to open X server", 300.0)) == []
    assert j.handle(Failed("import exited 1: unable to open X server",
                           60.0 + FAILURE_QUIET_S)) == [
        CheckFailed("import exited 1: unable to open X server", 5)]


# -- a real screen: Xvfb, xsetroot, import, Pillow ---------------------------------------
def draw(display: str, *args: str) -> None:
    subprocess.run(["xsetroot", "-display", display, *args], check=True, timeout=10)


def xbm(path, size: int, lit: int) -> str:
    """A size x size tile with a lit square of ``lit`` pixels in its corner."""
    rows = []
    for y in range(size):
        bits = [1 if x < lit and y < lit else 0 for x in range(size)]
        for b in range(0, size, 8):
            rows.append(sum(bit << i for i, bit in enumerate(bits[b:b + 8])))
    path.write_text(f"#define tile_width {size}\n#define tile_height {size}\n"
                    "static unsigned char tile_bits[] = {\n   "   # libX11 wants the break
                    + ", ".join(f"0x{v:02x}" for v in rows) + " };\n")
    return str(path)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def watch_of(display, clock, *, dark=lambda: None, upload=True, **judged):
    events, uploads, verdicts = [], [], []
    section = ScreenSection(x_display=display, upload_pictures=upload, **judged)
    w = from_config(section, commands(), {"PATH": os.environ["PATH"]}, dark=dark,
                    publish=events.append, enqueue=lambda kind, data: uploads.append((kind, data)),
                    on_verdict=verdicts.append)
    w.clock = clock
    return w, events, uploads, verdicts


def test_a_real_black_screen_is_black_and_its_thumbnail_is_queued_as_a_png(xvfb_pictures):
    display, clock = xvfb_pictures, Clock()
    draw(display, "-solid", "black")
    w, events, uploads, verdicts = watch_of(display, clock)
    assert w.check() == 60.0
    assert [e.type for e in events] == ["screen.black"] and verdicts == [BLACK]
    assert events[0].details == {"mean": 0.0, "contrast": 0.0, "bright": 0, "was": None,
                                 "captured_by": f"xwd on {display}"}
    [(kind, png)] = uploads
    from PIL import Image
    with Image.open(io.BytesIO(png)) as im:
        assert (kind, im.format, im.mode, im.size) == (SCREENSHOT, "PNG", "L", (64, 36))
    snap = w.snapshot()
    assert snap["verdict"] == BLACK and snap["captured_by"] == f"xwd on {display}"
    assert (snap["mean"], snap["contrast"], snap["failures"], snap["uploads"]) == (0.0, 0.0, 0, 1)


def write_bytes() -> int:
    """What this process, and the children it reaped, sent to storage."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))


def test_checks_write_nothing_to_storage_not_even_the_capture_tools_temporary_file(
        xvfb_pictures):
    display, clock = xvfb_pictures, Clock()
    draw(display, "-solid", "gray")
    w, events, uploads, verdicts = watch_of(display, clock)
    # ImageMagick's import (where xwd is not installed) writes its picture to a temporary
    # file before it prints it: on the tmpfs choose() gives it
    def by_import(temp_dir=None):
        chosen = capturing.choose(None, display, {"PATH": os.environ["PATH"]}, temp_dir=temp_dir)
        return capturing.Capture([shutil.which("import"), "-display", display, "-window",
                                  "root", "-depth", "8", "pgm:-"], "import", env=chosen.env)
    os.sync()
    before = write_bytes()
    for _ in range(5):
        w.check()
        assert by_import().take().picture is not None
    assert w.checks == 5 and w.snapshot()["failure"] is None
    assert write_bytes() - before == 0
    # the proof can fail: import with its temporary file on a disk (the checkout's: /tmp
    # may be a tmpfs) writes
    with tempfile.TemporaryDirectory(dir=REPO) as disk:
        on_disk = by_import(temp_dir=disk)
        before = write_bytes()
        assert on_disk.take().picture is not None
        assert write_bytes() - before > 0


def test_a_real_dark_scene_with_detail_is_not_black_and_a_dark_flat_one_is(xvfb_pictures,
                                                                          tmp_path):
    display, clock = xvfb_pictures, Clock()
    draw(display, "-bitmap", xbm(tmp_path / "tile.xbm", 32, 12), "-fg", "#303030",
         "-bg", "black")
    w, events, uploads, verdicts = watch_of(display, clock)
    w.check()
    snap = w.snapshot()
    assert snap["verdict"] == OK and events == [] and verdicts == [OK]
    assert snap["mean"] < 16 < snap["contrast"] * 4, snap   # darker than black_luma
    draw(display, "-solid", "#080808")
    clock.now += 60
    w.check()
    assert [e.type for e in events] == ["screen.black"], w.snapshot()
    assert events[0].details["was"] == OK


def test_a_real_static_board_is_frozen_only_where_its_content_is_declared_to_move(
        xvfb_pictures, tmp_path):
    display, clock = xvfb_pictures, Clock()
    draw(display, "-bitmap", xbm(tmp_path / "tile.xbm", 64, 24), "-fg", "white", "-bg", "navy")
    board, board_events, _, _ = watch_of(display, clock, upload=False)
    moving, moving_events, uploads, _ = watch_of(display, clock, content_moves=True,
                                                 frozen_after_s=300.0)
    for _ in range(7):
        board.check()
        moving.check()
        clock.now += 60
    assert board_events == [] and board.snapshot()["verdict"] == OK
    assert [e.type for e in moving_events] == ["screen.frozen"]
    assert moving_events[0].details["same_for_s"] == 300
    assert moving.snapshot()["verdict"] == FROZEN and len(uploads) == 1
    # it moves again: ok, told
    draw(display, "-bitmap", xbm(tmp_path / "other.xbm", 48, 8), "-fg", "white", "-bg", "navy")
    moving.check()
    assert [e.type for e in moving_events] == ["screen.frozen", "screen.ok"]


def test_a_real_animation_is_ok(xvfb_pictures, tmp_path):
    display, clock = xvfb_pictures, Clock()
    frames = [("-bitmap", xbm(tmp_path / f"f{i}.xbm", 64, lit), "-fg", "white", "-bg", "black")
              for i, lit in enumerate((8, 24, 40))] + [("-solid", "#6060c0")]
    w, events, uploads, verdicts = watch_of(display, clock, content_moves=True,
                                            frozen_after_s=60.0)
    for i in range(12):
        draw(display, *frames[i % len(frames)])
        w.check()
        clock.now += 30
    # every look is a sample the ladder hears; none is news
    assert events == [] and verdicts == [OK] * 12 and w.snapshot()["verdict"] == OK


def test_a_display_off_by_schedule_is_never_captured_and_never_black(xvfb_pictures):
    display, clock = xvfb_pictures, Clock()
    draw(display, "-solid", "black")
    why = ["off by working hours"]
    w, events, uploads, verdicts = watch_of(display, clock, dark=lambda: why[0])
    for _ in range(5):
        w.check()
        clock.now += 60
    assert w.checks == 0 and events == [] and uploads == [] and verdicts == [DARK] * 5
    snap = w.snapshot()
    assert (snap["verdict"], snap["dark"], snap["checked_s_ago"]) == (
        DARK, "off by working hours", None)
    why[0] = None            # the schedule lit it: what shows is judged again
    w.check()
    assert [e.type for e in events] == ["screen.black"] and verdicts == [DARK] * 5 + [BLACK]


def test_a_display_turned_off_while_it_was_captured_is_not_judged(xvfb_pictures):
    display, clock = xvfb_pictures, Clock()
    draw(display, "-solid", "black")
    answers = iter([None, "turned off by a display command"])
    w, events, _, verdicts = watch_of(display, clock, dark=lambda: next(answers))
    w.check()
    assert w.checks == 1 and events == [] and verdicts == [DARK]


def test_the_thread_checks_at_its_pace_and_stops_at_once(xvfb_pictures):
    display = xvfb_pictures
    draw(display, "-solid", "black")
    events = []
    w = from_config(ScreenSection(x_display=display, picture_every_s=0.1), commands(),
                    {"PATH": os.environ["PATH"]}, dark=lambda: None, publish=events.append)
    w.start()
    try:
        wait_for(lambda: w.checks >= 3, 10, what="three checks")
    finally:
        w.stop()
    started = time.monotonic()
    w.join(5)
    assert time.monotonic() - started < 2 and not w.loop._thread.is_alive()
    assert [e.type for e in events] == ["screen.black"]


def test_a_healthy_screen_is_checked_at_the_default_pace_and_a_bad_one_every_minute(
        xvfb_pictures, tmp_path):
    """The check's cost is paid rarely on a screen that is fine (the default, 15 min:
    README's measured cost); a black or frozen one is looked at again every minute,
    so that the recovery ladder's two samples and its proof after a rung come in time."""
    display, clock = xvfb_pictures, Clock()
    assert ScreenSection().picture_every_s == 900.0
    w, events, _, _ = watch_of(display, clock)
    draw(display, "-bitmap", xbm(tmp_path / "tile.xbm", 64, 24), "-fg", "white", "-bg", "navy")
    assert w.check() == 900.0
    draw(display, "-solid", "black")
    assert w.check() == BAD_EVERY_S == 60.0
    assert w.check() == 60.0
    draw(display, "-bitmap", xbm(tmp_path / "tile.xbm", 64, 24), "-fg", "white", "-bg", "navy")
    assert w.check() == 900.0


def test_a_check_every_0_s_is_off_and_starts_no_thread():
    w = from_config(ScreenSection(picture_every_s=0), commands(), {}, dark=lambda: None,
                    publish=lambda e: None)
    w.start()
    assert w.loop._thread.ident is None and w.snapshot()["verdict"] == "off"


# -- the capture's bounds and its failures, with real programs ---------------------------
def shot_of(command: str, **bounds) -> capturing.Shot:
    c = capturing.choose(command, None, dict(os.environ))
    for name, value in bounds.items():
        setattr(c, name, value)
    return c.take()


def test_a_configured_capture_command_that_prints_a_jpeg_is_read(tmp_path):
    from PIL import Image
    Image.new("RGB", (1920, 1080), (200, 30, 30)).save(tmp_path / "screen.jpg")
    shot = shot_of(f"cat {tmp_path / 'screen.jpg'}")
    assert shot.why == "" and (shot.picture.width, shot.picture.height) == (64, 36)
    assert abs(measure(shot.picture).mean - 83) < 3    # Pillow's L of (200, 30, 30)


def test_a_capture_that_fails_prints_nonsense_too_much_or_hangs_is_one_line(tmp_path):
    assert shot_of("false").why == "false exited 1"
    assert shot_of("sh -c 'echo no X server here >&2; exit 1'").why == \
        "sh exited 1: no X server here"
    assert shot_of("echo hello").why.startswith("the capture is not a picture")
    assert shot_of("true").why == "true printed no picture"
    assert shot_of("head -c 100000 /dev/zero", max_bytes=50000).why == \
        "head printed more than 50000 bytes"
    started = time.monotonic()
    assert shot_of("sh -c 'sleep 30; echo late'", timeout_s=0.5).why == \
        "sh timed out after 0.5 s"
    assert time.monotonic() - started < 3
    assert shot_of(f"{tmp_path}/nothing-here").why.endswith("No such file or directory")
    # raw pictures cut short, streamed (past the first read) or not, are said in one line
    (tmp_path / "short.xwd").write_bytes(xwd_dump(320, 720)[:300_000])
    (tmp_path / "tiny.xwd").write_bytes(xwd_dump(32, 32)[:2000])
    (tmp_path / "short.ppm").write_bytes(b"P6\n640 360\n255\n" + b"\x10" * 5000)
    for name in ("short.xwd", "tiny.xwd", "short.ppm"):
        assert shot_of(f"cat {tmp_path / name}").why == \
            "the capture is not a picture: cut short", name


def test_a_picture_too_large_for_a_screen_is_refused_before_it_is_decoded(tmp_path):
    bomb = tmp_path / "bomb.pgm"     # its header says 49 M pixels; 1000 bytes follow
    bomb.write_bytes(b"P5\n7000 7000\n255\n" + b"\0" * 1000)
    assert shot_of(f"cat {bomb}").why == \
        "the capture is too large to decode: 7000x7000 pixels"
    Image = capturing.pillow()   # a PNG's, from its header: as Pillow would hold it
    out = io.BytesIO()
    Image.new("L", (5000, 5000)).save(out, "PNG")
    (tmp_path / "big.png").write_bytes(out.getvalue())
    assert shot_of(f"cat {tmp_path / 'big.png'}").why.startswith(
        "the capture is too large to decode: a PNG of 5000x5000 would take 47 MiB")


def test_stop_kills_a_capture_running_and_refuses_the_next():
    c = capturing.choose("sleep 30", None, dict(os.environ))
    c.timeout_s = 20
    shots = []
    worker = start_worker("capture", lambda: shots.append(c.take()), reason="the test's")
    wait_for(lambda: c._running is not None, 5, what="the capture running")
    started = time.monotonic()
    c.stop()
    assert worker.join(5) and time.monotonic() - started < 2
    assert shots[0].why == "not captured: the agent is stopping"
    assert c.take().why == "not captured: the agent is stopping"


def test_which_tool_captures_this_screen():
    path = {"PATH": os.environ["PATH"]}
    c = capturing.choose(None, ":7", path)
    assert c.argv[1:] == ["-display", ":7", "-root", "-silent"] and c.how == "xwd on :7"
    wayland = capturing.choose(None, ":7", {"WAYLAND_DISPLAY": "wayland-1", "PATH": "/nowhere"})
    assert wayland.take() == capturing.Shot(why="no capture tool on this Wayland screen: grim "
                                                "is not installed", absent=True)
    assert capturing.choose(None, ":7", {"PATH": "/nowhere"}).take().absent
    none = capturing.choose(None, None, path).take()
    assert none.absent and "no WAYLAND_DISPLAY, no X display" in none.why
    # the X display the display commands name, as the read-back asks it
    w = from_config(ScreenSection(), commands("xset -display :9 dpms force off"),
                    path, dark=lambda: None, publish=lambda e: None)
    assert w.capture.how == "xwd on :9"


def test_a_screen_with_no_capture_tool_says_so_once_and_looks_again_rarely(caplog):
    caplog.set_level(logging.INFO, logger="edge_agent.screen")   # said, not a fault
    w = from_config(ScreenSection(), commands(), {"PATH": "/nowhere"}, dark=lambda: None,
                    publish=lambda e: pytest.fail("no event for a screen without a tool"))
    assert w.check() == ABSENT_EVERY_S
    assert w.check() == ABSENT_EVERY_S
    said = [r.getMessage() for r in caplog.records if "picture check" in r.getMessage()]
    assert len(said) == 1 and "no capture on this screen" in said[0]
    snap = w.snapshot()
    assert snap["verdict"] == "unavailable" and snap["failures"] == 0


def test_an_agent_without_pillow_runs_and_says_the_check_needs_it():
    code = (
        "import sys; sys.modules['PIL'] = None\n"
        "from agent.screen import watch, capture\n"
        "c = capture.choose('cat /dev/null', None, {})\n"
        "print(c.take())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=30)
    assert "picture check needs Pillow (python3-pil)" in out.stdout, out.stderr
    assert "absent=True" in out.stdout


def test_pillow_is_imported_only_when_a_capture_runs():
    code = "import sys; import agent.screen.watch; print('PIL' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.strip() == "False", out.stderr



def xwd_dump(width, height, pixel=lambda x, y: (x % 256, y % 256, 7)) -> bytes:
    """An XWD dump as xwd writes a 24-bit TrueColor root: 32 bits a pixel, LSB first."""
    import struct
    name = b"xwdump\x00"
    header_size = 100 + len(name)
    bpl = width * 4
    words = [header_size, 7, 2, 24, width, height, 0, 0, 32, 0, 32, 32, bpl, 4,
             0xFF0000, 0xFF00, 0xFF, 8, 256, 0, width, height, 0, 0, 0]
    rows = b"".join(bytes(c for x in range(width) for c in (*reversed(pixel(x, y)), 0))
                    for y in range(height))
    return struct.pack(">25I", *words) + name + rows


def test_an_xwd_dump_folded_as_it_streams_is_the_same_whatever_its_blocks():
    """Fold takes every row of the dump, whatever the blocks' sizes, and keeps none but
    its band: the same Picture as the whole dump folded at once, a dump cut short said
    so, never raised past the capture."""
    Image = capturing.pillow()
    dump = xwd_dump(320, 720)
    whole = capturing.thumbnail(Image, dump)
    for block in (1, 7, 100, 4096, len(dump)):
        fold = capturing.Fold.of(Image, dump[:capturing.HEAD_BYTES])
        for at in range(0, len(dump), block):
            fold.take(dump[at:at + block])
        assert fold.picture() == whole, block
    assert (whole.width, whole.height, whole.peak) == (28, 64, 227)
    with pytest.raises(capturing.NotAPicture, match="cut short"):
        capturing.thumbnail(Image, dump[:len(dump) // 2])


def test_one_lit_pixel_in_a_row_the_old_thumbnail_skipped_is_counted():
    """Every row is read: a line of text one pixel high on black, on any row, is detail."""
    Image = capturing.pillow()
    for row in (0, 7, 719):
        dump = xwd_dump(320, 720, lambda x, y: (200, 200, 200) if y == row and x < 40
                        else (0, 0, 0))
        m = measure(capturing.thumbnail(Image, dump))
        assert m.bright == 200 and not is_black(m, 16, 4), row
    assert is_black(measure(capturing.thumbnail(Image, xwd_dump(320, 720, lambda x, y: (
        0, 0, 0)))), 16, 4)


def test_black_is_the_brightest_detail_being_dark():
    def of(ground, peak, lit_cells=0):
        cells = bytes([ground + (1 if i < lit_cells else 0) for i in range(64 * 36)])
        return measure(Picture(64, 36, cells, peak))
    assert is_black(of(0, 0), 16, 4) and is_black(of(10, 10), 16, 4)  # blank, flat near-black
    assert not is_black(of(0, 255, 300), 16, 4)     # 300 white dots, averaged away in cells
    assert not is_black(of(8, 40, 20), 16, 4)       # gray 40 text on gray 8
    faint = of(4, 12, 50)                           # detail at 12 on 4: dark, but it shows
    assert (faint.bright, faint.ground) == (12, 4)
    assert not is_black(faint, 16, 4) and is_black(faint, 16, 10)


@pytest.mark.parametrize("mode", ["P", "1"])
def test_a_palette_or_bilevel_png_is_bounded_by_its_rgb_copy_too(mode):
    """A palette PNG of 3200x3200 is 1.3 kB and one byte a pixel; decoded it is made RGB
    (four a pixel in Pillow) before its grey copy: held as 2 a pixel, 19.5 MiB, it
    passed MAX_DECODED and took about 68 MiB (ru_maxrss)."""
    Image = capturing.pillow()
    out = io.BytesIO()
    Image.new(mode, (3200, 3200)).save(out, "PNG")
    with pytest.raises(capturing.NotAPicture, match="too large to decode: a PNG of 3200x3200"):
        capturing.decode(Image, out.getvalue())
    small = io.BytesIO()
    Image.new(mode, (1280, 720)).save(small, "PNG")
    assert capturing.thumbnail(Image, small.getvalue()).peak == 0


def test_a_kms_only_screen_says_the_picture_unavailable_and_reads_the_connector(tmp_path):
    """Raspberry Pi OS Lite, a player drawing straight to KMS (issue #52.3): no
    compositor to ask, no display configured. The DRM connector's state is what can be
    checked; the picture is declared unavailable, saying why, never guessed; a box whose
    connectors are all disconnected (a headless IoT player) loads no picture check."""
    from agent.config import load as cfgmod
    from agent.screen import part as screen_part
    from agent.screen.core import ON
    from tests.test_screen import connector
    connector(tmp_path)
    path = tmp_path / "agent.toml"
    path.write_text('[server]\nurl = "http://fleet.invalid"\n')
    config = cfgmod.load(str(path), {})

    def part():
        return screen_part.assemble(
            config, sysfs=str(tmp_path), environ={"PATH": os.environ["PATH"]},
            runtime_dir=str(tmp_path), publish=lambda e: None, enqueue=lambda k, d: None,
            gate=None)
    kms = part()
    assert kms.picture is not None, "a screen on KMS has its picture said, not left out"
    assert kms.picture.check() == ABSENT_EVERY_S
    picture = kms.snapshot()["picture"]
    assert picture["verdict"] == "unavailable", picture
    assert picture["unavailable"] == (
        "no capture on this screen: no compositor (no WAYLAND_DISPLAY, no X display); a "
        "player drawing straight to KMS is captured only by a [screen] capture_command "
        "that works with the unit's rights"), picture
    kms.watched.check()
    assert kms.watched.snapshot()["state"] == ON
    assert kms.watched.snapshot()["read"] == "DRM: card0-HDMI-A-1 enabled, On"
    connector(tmp_path, status="disconnected")
    assert part().picture is None
