"""The SMB benchmark's arithmetic: rates parsed from smbtorture, paired ratios."""

from dbwrap_py.bench.smb import Point, summary
from dbwrap_py.smbtorture import parse_rates

OUTPUT = """\
1.00 second: open[num/s=100,avslat=0.001000,minlat=0.1,maxlat=0.2] close[num/s=99,avslat=0.000500,minlat=0.1,maxlat=0.2]
2.00 second: open[num/s=200,avslat=0.002000,minlat=0.1,maxlat=0.2] close[num/s=198,avslat=0.001000,minlat=0.1,maxlat=0.2]
3.00 second: open[num/s=300,avslat=0.003000,minlat=0.1,maxlat=0.2] close[num/s=297,avslat=0.001500,minlat=0.1,maxlat=0.2]
success: path-contention-shared
"""


def test_parse_rates_leaves_out_the_first_second():
    rates = parse_rates(OUTPUT)
    assert rates.ok
    assert rates.opens == [100, 200, 300]
    assert rates.opens_per_second == 250
    assert rates.closes_per_second == 247.5
    assert not parse_rates(OUTPUT.replace("success", "failure")).ok


def test_summary_uses_paired_ratios():
    def point(mode, opens):
        return Point(mode, 4, opens, opens, 0.0, 0.0, True)

    points = [point("native", 1000), point("bridge+tdb", 900),
              point("native", 2000), point("bridge+tdb", 1000),
              point("native", 1000), point("bridge+tdb", 800)]
    (row,) = summary(points)
    assert row["native_opens_per_second"] == 1000
    assert row["bridge_opens_per_second"] == 900
    assert row["ratio"] == 0.8  # median of 0.9, 0.5, 0.8
    assert (row["ratio_min"], row["ratio_max"]) == (0.5, 0.9)
