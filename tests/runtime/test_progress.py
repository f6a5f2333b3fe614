"""Progress bars (fednovelty/runtime/progress.py): drawn by default only on a terminal."""

import io
import sys

from fednovelty.runtime.progress import progress_bar, show_progress


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return self.tty


def test_the_default_follows_whether_stderr_is_a_terminal(monkeypatch):
    for tty in (False, True):
        monkeypatch.setattr(sys, "stderr", _Stream(tty))
        assert show_progress() is tty and show_progress(None) is tty
        assert show_progress(True) is True and show_progress(False) is False
    closed = _Stream(True)
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    assert show_progress() is False  # a closed stream is no terminal


def test_a_bar_writes_nothing_off_a_terminal(monkeypatch):
    for tty, drawn in ((False, False), (True, True)):
        stream = _Stream(tty)
        monkeypatch.setattr(sys, "stderr", stream)
        with progress_bar(total=3, desc="probe", unit="step") as bar:
            bar.update(3)
        assert ("probe" in stream.getvalue()) is drawn
