cd /work/main
.venv/bin/python benchmarks/results/goodput-policy/run_policy.py --plan benchmarks/results/goodput/run-kernel/plan.json \
  --concurrency 16 --requests 2 --max-tokens 128 --turns all --fixed-ks 2 --out /tmp/runs/spy/run2 > /tmp/runs/spy/run2.log 2>&1 &
RP=$!
while [ ! -f /tmp/runs/spy/run2/server-n16-goodput.log ]; do sleep 1; done
sleep 2
PID=$(pgrep -f "draftwise serve" | head -1)
echo "server pid $PID" 
# wait for the warm-up to pass: the phase's first request in the log
for i in $(seq 1 120); do grep -q "POST /v1/chat/completions" /tmp/runs/spy/run2/server-n16-goodput.log 2>/dev/null && break; sleep 1; done
sleep 5
/work/main/.venv/bin/py-spy record -r 50 -d 40 -f raw -o /tmp/runs/spy/goodput-n16.txt -p $PID > /tmp/runs/spy/spy.log 2>&1
echo spy done
wait $RP
echo run done
