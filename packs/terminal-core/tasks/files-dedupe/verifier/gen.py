"""The photo tree, shared by setup.sh (creates it) and check.py (knows the answer)."""
import random


def tree() -> dict[str, str]:
    rng = random.Random(20240611)
    bodies = []
    for i in range(14):
        body = "".join(rng.choice("abcdef0123456789") for _ in range(64))
        bodies.append(f"RAW{i:02d}:{body}\n")
    # near-duplicates: same size, one character different
    bodies.append(bodies[0][:-2] + ("x" if bodies[0][-2] != "x" else "y") + "\n")
    bodies.append(bodies[3][:-2] + ("x" if bodies[3][-2] != "x" else "y") + "\n")
    files = {}
    dirs = ["", "2021/", "2022/", "2022/trip/", "export/"]
    n = 0
    for i, body in enumerate(bodies):
        copies = 1 + (i % 3 == 0) + (i % 5 == 0) + (i == 7) * 2
        for _ in range(copies):
            n += 1
            files[f"{rng.choice(dirs)}img_{rng.randrange(1000):03d}_{n}.raw"] = body
    return files
