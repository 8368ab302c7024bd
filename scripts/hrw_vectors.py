"""Write docs/cluster-hrw-vectors.json: golden vectors of the cluster owner map.

Every client and router, in any language, checks its port of "hrw-xxh64-v1" against these
cases (docs/cluster-routing.md). Deterministic: the same file on every run, so a test
(tests/test_owners.py) regenerates it and compares.

    python scripts/hrw_vectors.py            # rewrite the file
    python scripts/hrw_vectors.py --check    # exit 1 if the file differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flakekit.values.cluster import Member
from flakekit.values.owners import HASH_NAME, owner_of

OUT = Path(__file__).resolve().parent.parent / "docs" / "cluster-hrw-vectors.json"

#: name -> [(node, weight)]
VIEWS: dict[str, list[tuple[str, int]]] = {
    "one": [("node-a", 1)],
    "three": [("node-a", 1), ("node-b", 1), ("node-c", 1)],
    "three-weighted": [("idgen-1", 1), ("idgen-2", 2), ("idgen-3", 3)],
    "weights-1-8": [(f"w{w}", w) for w in range(1, 9)],
    "unicode-nodes": [("nœud-é", 2), ("узел-1", 1), ("节点", 3), ("node-z", 1)],
    "sixteen": [(f"idgen-{i}.svc:7000", 1 + i % 8) for i in range(16)],
    "sixty-four": [(f"n{i:02d}", 1 + (i % 4 == 0)) for i in range(64)],
    "max-weight": [("heavy", 64), ("light", 1)],
}

#: cases per view (the 64-member view's cases carry 64 members each: fewer of them)
PER_VIEW = {"one": 40, "sixty-four": 100}
DEFAULT_PER_VIEW = 140

SPECIAL_KEYS = [
    "", " ", "  ", "\t", "\n", "0", "a", "A", "#", "#0", "node-a#0", "-", ".",
    "order_cn", "order_us", "user_cn", "user_us", "invoice", "leaf-segment-test",
    "订单", "用户_cn", "ключ", "clé", "Straße", "ﬁ", "e\u0301", "\u00e9",  # no normalisation
    "🙂", "🙂🙂", "日本語のキー", "ﾊﾝｶｸ", "\u0000", "\u007f", "\u00a0", "\uffff",
    "\U0010ffff", "a" * 128, "x" * 1000, "tag:with:colons", "UPPER", "upper",
]


def keys_for(view: str, count: int) -> list[str]:
    """The special keys, then generated ones (deterministic: no randomness)."""
    out = list(SPECIAL_KEYS)
    i = 0
    while len(out) < count:
        forms = (f"tag-{i}", f"{view}/key-{i * 7919}", f"biz_{i:05d}", f"клиент-{i}",
                 f"键{i}")
        out.append(forms[i % len(forms)])
        i += 1
    return out[:count]


def build() -> dict[str, object]:
    cases = []
    for name, pairs in VIEWS.items():
        members = [Member(node, weight=weight) for node, weight in pairs]
        for key in keys_for(name, PER_VIEW.get(name, DEFAULT_PER_VIEW)):
            cases.append({"view": name, "members": [list(p) for p in pairs], "key": key,
                          "owner": owner_of(key, members).node})
    return {
        "hash": HASH_NAME,
        "algorithm": (
            "for each member (node, weight) and each r in range(weight): "
            "seed = XXH64(utf8(node + '#' + str(r)), seed=0); "
            "score = XXH64(utf8(key), seed=seed), unsigned 64-bit; the owner is the member "
            "with the highest score, a tie going to the larger node (UTF-8 bytes)"),
        "generated_by": "scripts/hrw_vectors.py",
        "xxh64_checks": [
            {"data": "", "seed": 0, "digest": "ef46db3751d8e999"},
            {"data": "node-a#0", "seed": 0,
             "digest": f"{owner_seed('node-a', 0):016x}"},
        ],
        "cases": cases,
    }


def owner_seed(node: str, replica: int) -> int:
    import xxhash

    return xxhash.xxh64_intdigest(f"{node}#{replica}".encode(), 0)


def render() -> str:
    data = build()
    cases = data.pop("cases")
    head = json.dumps(data, ensure_ascii=False, indent=2)[:-2]
    lines = ",\n".join("    " + json.dumps(c, ensure_ascii=False) for c in cases)  # type: ignore[attr-defined]
    return f'{head},\n  "cases": [\n{lines}\n  ]\n}}\n'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'differs: run scripts/hrw_vectors.py'}")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {len(json.loads(text)['cases'])} cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
