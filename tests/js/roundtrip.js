#!/usr/bin/env node
// kafkajs 2.2.4 against an oncelog broker; driven by tests/integration/test_kafkajs.py.
//
//   node roundtrip.js produce BOOTSTRAP TOPIC COUNT PARTITIONS [CODECS]
//       admin.createTopics, producer.send (acks=all, four sends cycling through
//       CODECS, default none,gzip; keys, headers, explicit timestamps),
//       admin.fetchTopicOffsets, then a read back through kafkajs's own Fetch
//       path (see fetchAll).
//   node roundtrip.js read BOOTSTRAP TOPIC
//       only the read back: every record of every partition of TOPIC.
//
// Prints one JSON summary line on stdout (kafkajs logs go to stderr). Keys,
// values and header values are base64 so bytes survive exactly.
//
// The read back deliberately uses no consumer group (group.js covers groups):
// kafkajs's lower-level cluster/broker objects send the same Fetch request and
// do the same record batch decoding (including gzip) as its Consumer.
'use strict'

const { Kafka, logLevel, CompressionTypes, CompressionCodecs, Partitioners } = require('kafkajs')

// kafkajs ships gzip only; snappy comes from the pure-JS codec package in
// package.json. No lz4 or zstd: their kafkajs codec packages need native
// addons built at install time (node-gyp), which a fresh CI machine may not
// build (see docs/client.md, interop notes).
CompressionCodecs[CompressionTypes.Snappy] = require('kafkajs-snappy')
const CODECS = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP, snappy: CompressionTypes.Snappy }

const DEADLINE_MS = Number(process.env.ROUNDTRIP_DEADLINE_MS || 60000)
const watchdog = setTimeout(() => {
  process.stderr.write(`roundtrip.js: deadline of ${DEADLINE_MS} ms exceeded\n`)
  process.exit(3)
}, DEADLINE_MS)

const b64 = buf => (buf === null || buf === undefined ? null : Buffer.from(buf).toString('base64'))

const stderrLogger = () => ({ namespace, level, label, log }) => {
  const { message, ...extra } = log
  process.stderr.write(`[kafkajs ${label} ${namespace}] ${message} ${JSON.stringify(extra)}\n`)
}

function makeKafka(bootstrap) {
  return new Kafka({
    clientId: 'oncelog-kafkajs-roundtrip',
    brokers: [bootstrap],
    logLevel: logLevel.WARN,
    logCreator: stderrLogger,
    connectionTimeout: 5000,
    requestTimeout: 15000,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
  })
}

// A Cluster built the way Kafka.producer()/consumer() build theirs.
function makeCluster(kafka) {
  const sym = Object.getOwnPropertySymbols(kafka).find(s => String(s).includes('createCluster'))
  if (!sym) throw new Error('kafkajs internals changed: no createCluster symbol')
  return kafka[sym]({ metadataMaxAge: 300000, allowAutoTopicCreation: false, isolationLevel: 0 })
}

// Read every record of every partition of `topic` from its log start to its
// high watermark with kafkajs Fetch requests (read_uncommitted).
async function fetchAll(kafka, topic) {
  const cluster = makeCluster(kafka)
  await cluster.connect()
  try {
    await cluster.addTargetTopic(topic)
    await cluster.refreshMetadata()
    const partitions = cluster.findTopicPartitionMetadata(topic).map(p => p.partitionId)
    const leaders = cluster.findLeaderForPartitions(topic, partitions)
    const records = []
    const fetchErrors = []
    for (const [nodeId, parts] of Object.entries(leaders)) {
      const broker = await cluster.findBroker({ nodeId })
      const next = {}
      const high = {}
      for (const p of parts) next[p] = null
      let rounds = 0
      for (;;) {
        const pending = parts.filter(p => next[p] === null || high[p] === undefined || next[p] < high[p])
        if (pending.length === 0) break
        if (++rounds > 10000) throw new Error('too many fetch rounds')
        const response = await broker.fetch({
          replicaId: -1,
          isolationLevel: 0,
          maxWaitTime: 100,
          minBytes: 1,
          maxBytes: 1048576,
          topics: [
            {
              topic,
              partitions: pending.map(p => ({
                partition: p,
                fetchOffset: String(next[p] === null ? 0 : next[p]),
                logStartOffset: '-1',
                maxBytes: 262144,
              })),
            },
          ],
        })
        for (const r of response.responses) {
          for (const pd of r.partitions) {
            const p = pd.partition
            if (pd.errorCode !== 0) {
              fetchErrors.push({ partition: p, errorCode: pd.errorCode })
              throw new Error(`fetch error ${pd.errorCode} on partition ${p}`)
            }
            high[p] = Number(pd.highWatermark)
            if (next[p] === null) next[p] = 0
            for (const m of pd.messages) {
              const offset = Number(m.offset)
              if (offset < next[p]) continue // the whole batch is returned; skip what we have
              if (m.isControlRecord) {
                next[p] = offset + 1
                continue
              }
              records.push({
                partition: p,
                offset,
                key: b64(m.key),
                value: b64(m.value),
                timestamp: Number(m.timestamp),
                headers: Object.entries(m.headers || {}).map(([k, v]) => [k, b64(v)]),
              })
              next[p] = offset + 1
            }
          }
        }
      }
    }
    records.sort((a, b) => a.partition - b.partition || a.offset - b.offset)
    return { records, fetchErrors }
  } finally {
    await cluster.disconnect()
  }
}

async function produceMode(bootstrap, topic, count, numPartitions, codecs) {
  const kafka = makeKafka(bootstrap)
  const admin = kafka.admin()
  await admin.connect()
  const summary = { mode: 'produce', topic, count }
  try {
    summary.created = await admin.createTopics({
      topics: [{ topic, numPartitions, replicationFactor: 1 }],
      waitForLeaders: true,
      timeout: 10000,
    })
    summary.listed = (await admin.listTopics()).includes(topic)
    const md = await admin.fetchTopicMetadata({ topics: [topic] })
    summary.metadataPartitions = md.topics[0].partitions.length

    const producer = kafka.producer({
      createPartitioner: Partitioners.DefaultPartitioner,
      allowAutoTopicCreation: false,
      idempotent: false,
    })
    await producer.connect()
    const produced = []
    const baseTs = Date.now() - 60000
    try {
      // four sends, cycling through the codecs asked for
      const perSend = Math.ceil(count / 4)
      for (let s = 0, i = 0; i < count; s++) {
        const batch = []
        for (let n = 0; n < perSend && i < count; n++, i++) {
          const headers = { id: String(i), origin: 'kafkajs' }
          if (i % 3 === 0) headers.bin = Buffer.from([i & 0xff, 0, 0xfe, 0x7f])
          batch.push({
            id: i,
            message: {
              key: `kjs-key-${i}`,
              value: JSON.stringify({ id: i, from: 'kafkajs', pad: 'z'.repeat(i % 40) }),
              headers,
              timestamp: String(baseTs + i * 7),
            },
          })
        }
        const compression = codecs[s % codecs.length]
        const meta = await producer.send({
          topic,
          acks: -1,
          compression,
          messages: batch.map(b => b.message),
        })
        // kafkajs groups the messages of one send by partition, keeping their order,
        // and reports each partition's base offset
        const partitioner = Partitioners.DefaultPartitioner()
        const partitionMetadata = md.topics[0].partitions.map(p => ({ partitionId: p.partitionId, leader: p.leader }))
        const next = {}
        for (const m of meta) {
          if (m.errorCode !== 0) throw new Error(`produce error ${m.errorCode} on partition ${m.partition}`)
          next[m.partition] = Number(m.baseOffset)
        }
        for (const b of batch) {
          const partition = partitioner({ topic, partitionMetadata, message: b.message })
          if (next[partition] === undefined) throw new Error(`no produce result for partition ${partition}`)
          produced.push({
            id: b.id,
            partition,
            offset: next[partition]++,
            key: b64(Buffer.from(b.message.key)),
            value: b64(Buffer.from(b.message.value)),
            timestamp: Number(b.message.timestamp),
            headers: Object.entries(b.message.headers).map(([k, v]) => [k, b64(Buffer.from(v))]),
            compression,
          })
        }
      }
    } finally {
      await producer.disconnect()
    }
    summary.produced = produced
    summary.offsets = (await admin.fetchTopicOffsets(topic)).map(o => ({
      partition: o.partition,
      high: Number(o.high),
      low: Number(o.low),
    }))
    summary.highWatermarkTotal = summary.offsets.reduce((acc, o) => acc + o.high, 0)
  } finally {
    await admin.disconnect()
  }
  Object.assign(summary, await fetchAll(kafka, topic))
  return summary
}

async function readMode(bootstrap, topic) {
  const kafka = makeKafka(bootstrap)
  const admin = kafka.admin()
  await admin.connect()
  const summary = { mode: 'read', topic }
  try {
    summary.offsets = (await admin.fetchTopicOffsets(topic)).map(o => ({
      partition: o.partition,
      high: Number(o.high),
      low: Number(o.low),
    }))
  } finally {
    await admin.disconnect()
  }
  Object.assign(summary, await fetchAll(kafka, topic))
  return summary
}

async function main() {
  const [mode, bootstrap, topic, count, partitions, codecNames] = process.argv.slice(2)
  if (!bootstrap || !topic) throw new Error('usage: roundtrip.js produce|read BOOTSTRAP TOPIC [COUNT PARTITIONS]')
  let summary
  const codecs = (codecNames || 'none,gzip').split(',').map(n => {
    if (!(n in CODECS)) throw new Error(`unknown codec ${n} (kafkajs here has ${Object.keys(CODECS)})`)
    return CODECS[n]
  })
  if (mode === 'produce') summary = await produceMode(bootstrap, topic, Number(count || 100), Number(partitions || 3), codecs)
  else if (mode === 'read') summary = await readMode(bootstrap, topic)
  else throw new Error(`unknown mode ${mode}`)
  summary.ok = true
  return summary
}

main()
  .then(summary => {
    clearTimeout(watchdog)
    // exit only once the (possibly > 64 KiB) line is flushed: process.exit() cuts a pipe short
    process.stdout.write(JSON.stringify(summary) + '\n', () => process.exit(0))
  })
  .catch(err => {
    process.stderr.write(`roundtrip.js failed: ${err && err.stack ? err.stack : err}\n`)
    process.stdout.write(JSON.stringify({ ok: false, error: String(err && err.message ? err.message : err) }) + '\n')
    process.exit(1)
  })
