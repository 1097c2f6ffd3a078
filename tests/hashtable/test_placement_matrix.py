"""The placement matrix (``tests/helpers/placement_matrix.py``): every table operation on one
device, on a mesh of one device and on 8 shards, against the plain-Python reference.

The first two placements run here; the 8 shards run in the 8-device child
(``tests/helpers/eight_devices.py``), and each row's test on them reads its result.
"""

import pytest

from tests.helpers import eight_devices
from tests.helpers import placement_matrix as matrix


def _params():
    for row in matrix.ROWS:
        for placement in matrix.PLACEMENTS:
            marks = ([pytest.mark.eight_devices(f"matrix.{row.id}")]
                     if placement == matrix.EIGHT else [])
            if placement in row.known_defect:
                marks.append(pytest.mark.xfail(strict=True, reason=row.known_defect[placement]))
            yield pytest.param(row, placement, id=f"{row.id}-{placement}", marks=marks)


@pytest.mark.parametrize("row, placement", list(_params()))
def test_row(row, placement):
    if placement == matrix.EIGHT:
        eight_devices.assert_passed(f"matrix.{row.id}")
    else:
        matrix.run_row(row, placement)
