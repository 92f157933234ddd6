"""hvdkit launch puts the ranks' lines back together from mpirun's tagged pieces (issue 54, case 6).

The inputs are lines `hvdkit launch -np 2` passed through before the fix, with two ranks printing 3000 lines each
under PYTHONUNBUFFERED=1 (73 of 6000 came in pieces); tests/multiproc/test_launch_output.py runs that job.
"""

import pytest

from hvdkit.ops.job_output import WholeLines

pytestmark = pytest.mark.unit
X40 = "x" * 40


def joined(*raw: str) -> list[str]:
    joiner = WholeLines()
    out = [line for r in raw for line in joiner.feed(r)]
    return out + joiner.flush()


def test_a_line_split_in_the_middle_comes_out_whole():
    assert joined(f"[1,1]<stdout>:rank 1 line 73 xx[1,1]<stdout>:{X40[2:]}\n") == \
        [f"[1,1]<stdout>:rank 1 line 73 {X40}\n"]


def test_a_newline_that_came_as_its_own_piece_ends_the_line_before_it():
    assert joined(f"[1,1]<stdout>:rank 1 line 201 {X40}[1,1]<stdout>:\n",
                  f"[1,1]<stdout>:rank 1 line 202 {X40}[1,1]<stdout>:\n") == \
        [f"[1,1]<stdout>:rank 1 line 201 {X40}\n", f"[1,1]<stdout>:rank 1 line 202 {X40}\n"]


def test_another_ranks_line_inside_an_open_one_comes_first_and_the_open_one_is_finished_later():
    assert joined("[1,0]<stdout>:final test accuracy 97.50% (2 processes)[1,1]<stdout>:epoch 3\n",
                  "[1,0]<stdout>:\n") == \
        ["[1,1]<stdout>:epoch 3\n", "[1,0]<stdout>:final test accuracy 97.50% (2 processes)\n"]


def test_stdout_and_stderr_of_one_rank_are_kept_apart():
    assert joined("[1,0]<stdout>:half[1,0]<stderr>:warning\n", "[1,0]<stdout>: done\n") == \
        ["[1,0]<stderr>:warning\n", "[1,0]<stdout>:half done\n"]


def test_untagged_lines_and_gloo_lines_pass_as_they_are():
    lines = ["hvdkit launch: /usr/bin/horovodrun -np 2 ...\n", "[0]<stdout>:whole line[1]\n",
             "--------------------------------------------------------------------------\n"]
    assert joined(*lines) == lines


def test_a_piece_still_open_at_the_end_is_ended_with_a_newline():
    assert joined("[1,1]<stdout>:no newline") == ["[1,1]<stdout>:no newline\n"]
