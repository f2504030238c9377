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


# Samba 4.25's smbtorture: thousands grouped, fields separated by semicolons
OUTPUT_4_25 = """\
1.00 second: open[num/s=19,587;avslat=0.000109;minlat=0.000033;maxlat=0.002026] close[num/s=19,586;avslat=0.000095;minlat=0.000024;maxlat=0.001991]
2.00 second: open[num/s=1,146;avslat=0.000106;minlat=0.000033;maxlat=0.002004] close[num/s=999;avslat=0.000103;minlat=0.000024;maxlat=0.002191]
success: path-contention-shared
"""


def test_parse_rates_reads_4_25s_grouped_numbers():
    rates = parse_rates(OUTPUT_4_25)
    assert rates.ok
    assert rates.opens == [19587, 1146]
    assert rates.closes == [19586, 999]
    assert rates.open_latency == [0.000109, 0.000106]


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
