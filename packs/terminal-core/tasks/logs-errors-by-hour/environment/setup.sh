set -e
python3 - <<'GEN'
import random
rng = random.Random(202)
ips = [f"10.0.{rng.randint(0, 3)}.{rng.randint(1, 40)}" for _ in range(25)] + ["192.168.1.7", "172.16.0.9"]
weights = [rng.randint(1, 30) for _ in ips]
paths = ["/", "/login", "/api/items", "/api/items/42", "/api/search", "/static/app.js", "/healthz", "/api/orders"]
months = ["Oct"]
t = 1728550800  # 2024-10-10T09:00:00Z
lines = []
for i in range(2500):
    t += rng.randint(1, 25)
    ip = rng.choices(ips, weights)[0]
    path = rng.choice(paths)
    if rng.random() < 0.2:
        path += f"?q={rng.randint(1, 99)}"
    method = "POST" if path.startswith("/login") else rng.choice(["GET", "GET", "GET", "HEAD"])
    status = rng.choices([200, 200, 200, 304, 404, 500, 502, 503], [50, 20, 10, 8, 6, 3, 2, 1])[0]
    size = rng.randint(0, 50000)
    base = {"/api/search": 0.8, "/api/orders": 0.5, "/login": 0.3}.get(path.split("?")[0], 0.05)
    rt = round(base * rng.uniform(0.5, 2.0) + rng.random() * 0.01, 3)
    hh, rem = divmod(t - 1728518400, 3600)
    day = 10 + hh // 24
    hh %= 24
    mm, ss = divmod(rem, 60)
    stamp = f"{day:02d}/Oct/2024:{hh:02d}:{mm:02d}:{ss:02d} +0000"
    lines.append(f'{ip} - - [{stamp}] "{method} {path} HTTP/1.1" {status} {size} {rt:.3f}')
with open("access.log", "w") as fh:
    fh.write("\n".join(lines) + "\n")
GEN
