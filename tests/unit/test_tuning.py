"""Horovod settings Horovod would silently misread (it parses them with strtol/strtod) stop with one line."""

import pytest

from hvdkit.core.errors import UserError
from hvdkit.core.tuning import apply_horovod_defaults, check_horovod_environment

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("env, message", [
    ({"HOROVOD_CYCLE_TIME": "abc"}, "HOROVOD_CYCLE_TIME='abc' is not a number >= 0 .*set e.g. HOROVOD_CYCLE_TIME=1"),
    ({"HOROVOD_CYCLE_TIME": "-1"}, "is not a number >= 0"),
    ({"HOROVOD_FUSION_THRESHOLD": "64M"}, "HOROVOD_FUSION_THRESHOLD='64M' is not a whole number"),
    ({"HOROVOD_STALL_CHECK_TIME_SECONDS": "1.5"}, "is not a whole number"),
    ({"HOROVOD_STALL_CHECK_DISABLE": "true"}, "HOROVOD_STALL_CHECK_DISABLE='true' is not 0 or 1.*'true' means off"),
    ({"HOROVOD_BLOCKING_WAIT": "yes"}, "HOROVOD_BLOCKING_WAIT='yes' is not 0 or 1"),   # patch item 11's switch
])
def test_misread_settings_are_refused(env, message):
    with pytest.raises(UserError, match=message):
        check_horovod_environment(env)
    with pytest.raises(UserError, match=message):        # init() checks before it sets anything
        apply_horovod_defaults(False, dict(env))


def test_good_settings_pass():
    check_horovod_environment({"HOROVOD_CYCLE_TIME": "0.1", "HOROVOD_FUSION_THRESHOLD": "16777216",
                               "HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_MISMATCH_SHUTDOWN": "0",
                               "HOROVOD_BLOCKING_WAIT": "1", "HOROVOD_CYCLE_TIME_X": "anything"})
    # as Horovod reads them: scientific notation, a YAML float for an integer, an empty value, a flag of 2
    check_horovod_environment({"HOROVOD_CYCLE_TIME": "1e-3", "HOROVOD_CACHE_CAPACITY": "1024.0",
                               "HOROVOD_FUSION_THRESHOLD": "", "HOROVOD_AUTOTUNE": "2"})
