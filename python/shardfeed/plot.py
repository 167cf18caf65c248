"""Draws a `shardfeed bench --sweep` result: images/s and the consumer's wait fraction against
the swept settings, one line per combination of the other settings.

    python -m shardfeed.plot SWEEP.json OUT.png

(`shardfeed bench ARCHIVE --sweep workers=1,2,4 prefetch=2,4,8 --plot OUT.png` runs this.)
"""
import json
import sys


def _number(text):
    try:
        return float(text)
    except ValueError:
        return text


def plot(data, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    swept, results = data["swept"], data["results"]
    if not swept or not results:
        raise ValueError("the sweep has no results")
    x_name, rest = swept[0], swept[1:]
    lines = {}
    for r in results:
        key = tuple((name, r["settings"][name]) for name in rest)
        lines.setdefault(key, []).append(r)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, points in lines.items():
        points.sort(key=lambda r: (_number(r["settings"][x_name]) if
                                   isinstance(_number(r["settings"][x_name]), float) else 0,
                                   str(r["settings"][x_name])))
        xs = [str(r["settings"][x_name]) for r in points]
        label = ", ".join("%s=%s" % kv for kv in key) or "images/s"
        left.plot(xs, [r["images_per_second"] for r in points], marker="o", label=label)
        right.plot(xs, [100 * r["wait_fraction"] for r in points], marker="o", label=label)
    left.set_xlabel(x_name)
    left.set_ylabel("images/s")
    left.set_title("throughput")
    right.set_xlabel(x_name)
    right.set_ylabel("% of the consumer's time")
    right.set_title("consumer waiting for data")
    right.set_ylim(0, 105)
    left.set_ylim(bottom=0)
    if rest:
        left.legend(fontsize=8)
    fig.suptitle("%s: batch %s, step %s ms" % (data.get("archive", ""), data.get("batch_size"),
                                               data.get("step_ms")), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


NO_MATPLOTLIB = 4  # the exit code that says: try another interpreter (bench --plot does)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.stderr.write("%s has no matplotlib (Debian: apt-get install python3-matplotlib)\n"
                         % sys.executable)
        return NO_MATPLOTLIB
    with open(argv[0]) as f:
        plot(json.load(f), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
