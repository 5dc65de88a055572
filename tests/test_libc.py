"""The C library's calls that os has no word for: the kernel's clock flag (adjtimex),
a queue segment's blocks allocated past its end (fallocate, FALLOC_FL_KEEP_SIZE), core
dumps turned off (prctl: test_crashes.py). Real calls on this machine's kernel."""
import os

from agent.base.clock import kernel_synced
from agent.uploads import segments


def test_the_kernels_clock_flag_is_read():
    """adjtimex with nothing to set is allowed to anyone: an answer, not None."""
    assert kernel_synced() in (True, False)


def test_a_segment_is_allocated_past_its_end_and_keeps_its_size(tmp_path):
    path = tmp_path / "segment"
    with open(path, "wb") as f:
        before = os.fstat(f.fileno()).st_blocks
        segments.reserve(f.fileno(), 4 << 20)
        st = os.fstat(f.fileno())
    assert st.st_size == 0, "the size still says where the items end"
    assert (st.st_blocks - before) * 512 >= 4 << 20, st


def test_the_c_library_is_opened_once():
    from agent.base.libc import libc
    assert libc() is libc()
