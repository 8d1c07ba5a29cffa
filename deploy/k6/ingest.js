// k6 load suite for spate's HTTP ingest.
//
//   k6 run deploy/k6/ingest.js                         # smoke: 2 VUs, 5 s
//   SCENARIO=standard MODE=blocking RECORDS=100 SIZE=256 k6 run deploy/k6/ingest.js
//
// Environment:
//   BASE_URL   spate's HTTP (or --ingest-listen) address   (http://127.0.0.1:9644)
//   TOPIC      topic to produce to                         (k6-ingest)
//   MODE       blocking (POST /topics/{topic}) | fire (POST /produce/fire/batch)
//   RECORDS    records per request                         (10; the suite uses 10 and 100)
//   SIZE       bytes per record value                      (1024; the suite uses 1024 and 256)
//   ACKS       0 | 1 | all                                 (all)
//   SCENARIO   smoke | standard (ramp to 500 VUs) | max (MAX_VUS for DURATION) |
//              stress (arrival rate raised until it breaks) | steady (VUS for DURATION)
//   VUS, MAX_VUS, DURATION   for steady and max            (10, 500, 2m)
//   KEYED      1: each record has a key (spread over partitions by murmur2); 0: keyless
//              (a request's records go to one partition, as a Kafka producer's batch does)  (1)
//   POOL       bodies each VU builds once and sends in turn; 0 builds one per request  (8)
//
// Checks read the body: a blocking answer is 200 with `delivered` equal to the records sent
// and no per-record error; a fire answer is 202 with `accepted` equal to them. The counters
// ingest_delivered_records / ingest_accepted_records are what k6 was told; scripts/k6-ingest.sh
// compares them with what the topic holds afterwards.
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Rate } from 'k6/metrics';

const BASE_URL = __ENV.BASE_URL || 'http://127.0.0.1:9644';
const TOPIC = __ENV.TOPIC || 'k6-ingest';
const MODE = __ENV.MODE || 'blocking';
const RECORDS = parseInt(__ENV.RECORDS || '10', 10);
const SIZE = parseInt(__ENV.SIZE || '1024', 10);
const ACKS = __ENV.ACKS || 'all';
const SCENARIO = __ENV.SCENARIO || 'smoke';
const VUS = parseInt(__ENV.VUS || '10', 10);
const MAX_VUS = parseInt(__ENV.MAX_VUS || '500', 10);
const DURATION = __ENV.DURATION || '2m';
const KEYED = (__ENV.KEYED || '1') !== '0';

const delivered = new Counter('ingest_delivered_records');
const failedRecords = new Counter('ingest_failed_records');
const accepted = new Counter('ingest_accepted_records');
const busy = new Counter('ingest_busy_answers');
const bodyOk = new Rate('ingest_body_ok');

const scenarios = {
  smoke: { executor: 'constant-vus', vus: 2, duration: '5s' },
  steady: { executor: 'constant-vus', vus: VUS, duration: DURATION },
  standard: {
    executor: 'ramping-vus',
    startVUs: 0,
    stages: [
      { duration: '30s', target: 50 },
      { duration: '1m', target: 200 },
      { duration: '1m', target: 500 },
      { duration: '2m', target: 500 },
      { duration: '30s', target: 0 },
    ],
    gracefulRampDown: '10s',
  },
  max: { executor: 'constant-vus', vus: MAX_VUS, duration: DURATION },
  // Requests per second raised step by step; thresholds abort the run when it breaks.
  stress: {
    executor: 'ramping-arrival-rate',
    startRate: 100,
    timeUnit: '1s',
    preAllocatedVUs: 100,
    maxVUs: 2000,
    stages: [
      { duration: '1m', target: 500 },
      { duration: '1m', target: 1000 },
      { duration: '1m', target: 2000 },
      { duration: '1m', target: 4000 },
      { duration: '1m', target: 8000 },
      { duration: '1m', target: 16000 },
    ],
  },
};

const stress = SCENARIO === 'stress';
export const options = {
  scenarios: { ingest: scenarios[SCENARIO] },
  thresholds: {
    ingest_body_ok: [{ threshold: 'rate>0.99', abortOnFail: stress, delayAbortEval: '20s' }],
    http_req_failed: [{ threshold: 'rate<0.01', abortOnFail: stress, delayAbortEval: '20s' }],
    http_req_duration: [
      { threshold: MODE === 'fire' ? 'p(95)<500' : 'p(95)<2000', abortOnFail: stress, delayAbortEval: '20s' },
    ],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(90)', 'p(95)', 'p(99)', 'max'],
  discardResponseBodies: false,
};

// One filler per run: values differ in their prefix, the rest is shared text.
const FILL = 'abcdefghijklmnopqrstuvwxyz0123456789'.repeat(Math.ceil(SIZE / 36) + 1);

// Each VU builds POOL bodies on first use and sends them in turn (POOL=0: a new body for every
// request). Building a 100-record body in JavaScript took more of k6's CPU than sending it,
// and k6 shares the machine's cores with the broker it measures.
const POOL = parseInt(__ENV.POOL || '8', 10);
const pool = [];

function build(tag) {
  const recs = new Array(RECORDS);
  for (let i = 0; i < RECORDS; i++) {
    const id = `${__VU}-${tag}-${i}`;
    const value = (id + '|' + FILL).substring(0, SIZE);
    recs[i] = KEYED ? `{"key":"k${id}","value":"${value}"}` : `{"value":"${value}"}`;
  }
  return MODE === 'fire'
    ? `{"topic":"${TOPIC}","records":[${recs.join(',')}]}`
    : `{"records":[${recs.join(',')}]}`;
}

function body() {
  if (POOL <= 0) return build(__ITER);
  const slot = __ITER % POOL;
  if (pool[slot] === undefined) pool[slot] = build(`p${slot}`);
  return pool[slot];
}

const params = {
  headers: { 'Content-Type': 'application/json' },
  responseCallback: http.expectedStatuses(200, 202),
};

export default function () {
  if (MODE === 'fire') {
    const r = http.post(`${BASE_URL}/produce/fire/batch`, body(), params);
    if (r.status === 429) busy.add(1);
    let n = 0;
    const ok = check(r, {
      'fire: 202': (res) => res.status === 202,
      'fire: accepted equals sent': (res) => {
        if (res.status !== 202) return false;
        n = res.json('accepted');
        return n === RECORDS;
      },
    });
    if (n) accepted.add(n);
    bodyOk.add(ok);
    return;
  }
  const r = http.post(`${BASE_URL}/topics/${TOPIC}?acks=${ACKS}`, body(), params);
  if (r.status === 429) busy.add(1);
  let d = 0;
  let f = 0;
  const ok = check(r, {
    'blocking: 200': (res) => res.status === 200,
    'blocking: delivered equals sent': (res) => {
      if (res.status !== 200 && res.status !== 207) return false;
      d = res.json('delivered');
      f = res.json('failed');
      return d === RECORDS;
    },
    'blocking: no per-record errors': (res) => {
      if (res.status !== 200 && res.status !== 207) return false;
      // Counted by gjson on k6's Go side, and a regular expression for any error code that is
      // not null: converting 100 offsets into JavaScript objects cost more CPU than the broker
      // spent on the request.
      return res.json('offsets.#') === RECORDS && !/"error_code":-?\d/.test(res.body);
    },
  });
  if (d) delivered.add(d);
  if (f) failedRecords.add(f);
  bodyOk.add(ok);
}
