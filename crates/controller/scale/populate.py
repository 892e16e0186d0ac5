# populate.py VOLUMES SNAPSHOTS: make VOLUMES volumes (vol0000...) with SNAPSHOTS snapshots each
# (s00...) through the daemon's TCP API (LAMINA_ENDPOINT, LAMINA_TOKEN), 4 at a time.
import http.client, json, os, sys, time, urllib.parse
from concurrent.futures import ThreadPoolExecutor
ep = urllib.parse.urlparse(os.environ["LAMINA_ENDPOINT"]); tok = os.environ["LAMINA_TOKEN"]
nv, ns = int(sys.argv[1]), int(sys.argv[2])
def call(conn, method, path, body):
    conn.request(method, path, json.dumps(body), {"authorization": "Bearer " + tok, "content-type": "application/json"})
    r = conn.getresponse(); data = r.read()
    if r.status >= 300: raise SystemExit(f"{method} {path}: {r.status} {data}")
def one(i):
    c = http.client.HTTPConnection(ep.hostname, ep.port)
    v = f"vol{i:04d}"
    call(c, "POST", "/v1/volumes", {"name": v, "size": 1 << 20})
    for j in range(ns):
        call(c, "POST", f"/v1/volumes/{v}/snapshots", {"name": f"s{j:02d}"})
t = time.time()
with ThreadPoolExecutor(4) as ex: list(ex.map(one, range(nv)))
print(f"{nv} volumes x {ns} snapshots in {time.time()-t:.1f} s")
