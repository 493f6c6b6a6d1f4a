#!/usr/bin/env node
// kafkajs 2.2.4 transactions against an oncelog broker; driven by
// tests/integration/test_kafkajs_txn.py.
//
//   node txn.js produce BOOTSTRAP TOPIC TRANSACTIONAL_ID PLAN PARTITIONS
//       a transactional kafkajs Producer (transactionalId, idempotent,
//       maxInFlightRequests 1: InitProducerId, AddPartitionsToTxn, Produce,
//       EndTxn) runs the transactions of PLAN, e.g. "C30,A20,C10": commit 30
//       records, abort 20, commit 10. Record i goes to partition i % PARTITIONS
//       with the value "js:<i>". Reports the values sent per transaction.
//   node txn.js consume BOOTSTRAP TOPIC GROUP COUNT
//       a kafkajs Consumer with readUncommitted: false (read_committed) joins
//       GROUP, reads TOPIC from the beginning until it has COUNT records and
//       then 2 s more (so records that must not be visible would show), and
//       reports every record (partition, offset, value).
//
// Prints one JSON summary line on stdout (kafkajs logs go to stderr).
'use strict'

const { Kafka, logLevel } = require('kafkajs')

const DEADLINE_MS = Number(process.env.TXN_DEADLINE_MS || 60000)
const QUIET_MS = 2000
const watchdog = setTimeout(() => {
  process.stderr.write(`txn.js: deadline of ${DEADLINE_MS} ms exceeded\n`)
  process.exit(3)
}, DEADLINE_MS)

const stderrLogger = () => ({ namespace, label, log }) => {
  const { message, ...extra } = log
  process.stderr.write(`[kafkajs ${label} ${namespace}] ${message} ${JSON.stringify(extra)}\n`)
}

function makeKafka(bootstrap, clientId) {
  return new Kafka({
    clientId,
    brokers: [bootstrap],
    logLevel: logLevel.WARN,
    logCreator: stderrLogger,
    connectionTimeout: 5000,
    requestTimeout: 15000,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
  })
}

async function produce(bootstrap, topic, transactionalId, plan, partitions) {
  const kafka = makeKafka(bootstrap, 'oncelog-kafkajs-txn')
  const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })
  await producer.connect()
  const summary = { transactions: [] }
  let next = 0
  try {
    for (const step of plan.split(',')) {
      const commit = step[0] === 'C'
      if (!commit && step[0] !== 'A') throw new Error(`bad plan step ${step}`)
      const count = Number(step.slice(1))
      const sent = []
      const txn = await producer.transaction()
      // several sends per transaction, each one Produce request
      for (let start = 0; start < count; start += 7) {
        const messages = []
        for (let i = start; i < Math.min(count, start + 7); i++) {
          const id = next++
          const m = { value: `js:${id}`, partition: id % partitions }
          messages.push(m)
          sent.push({ partition: m.partition, value: m.value })
        }
        await txn.send({ topic, acks: -1, messages })
      }
      if (commit) await txn.commit()
      else await txn.abort()
      summary.transactions.push({ commit, sent })
    }
  } finally {
    await producer.disconnect()
  }
  return summary
}

async function consume(bootstrap, topic, groupId, count) {
  const kafka = makeKafka(bootstrap, 'oncelog-kafkajs-txn-consumer')
  const consumer = kafka.consumer({
    groupId, readUncommitted: false, sessionTimeout: 6000, heartbeatInterval: 500, rebalanceTimeout: 10000,
    maxWaitTimeInMs: 200,
  })
  const summary = { records: [] }
  await consumer.connect()
  try {
    await consumer.subscribe({ topic, fromBeginning: true })
    let done
    const finished = new Promise(resolve => { done = resolve })
    let quietTimer = null
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        summary.records.push({ partition, offset: Number(message.offset), value: message.value.toString() })
        if (summary.records.length >= count && quietTimer === null) quietTimer = setTimeout(done, QUIET_MS)
      },
    })
    if (count === 0) quietTimer = setTimeout(done, QUIET_MS * 2)
    await finished
  } finally {
    await consumer.disconnect()
  }
  return summary
}

async function main() {
  const [mode, bootstrap, topic, ...rest] = process.argv.slice(2)
  let summary
  if (mode === 'produce') {
    const [transactionalId, plan, partitions] = rest
    summary = await produce(bootstrap, topic, transactionalId, plan, Number(partitions || 3))
  } else if (mode === 'consume') {
    const [group, count] = rest
    summary = await consume(bootstrap, topic, group, Number(count))
  } else {
    throw new Error('usage: txn.js produce|consume BOOTSTRAP TOPIC ...')
  }
  summary.ok = true
  process.stdout.write(JSON.stringify(summary) + '\n')
}

main()
  .then(() => {
    clearTimeout(watchdog)
    process.exit(0)
  })
  .catch(err => {
    process.stderr.write(`txn.js failed: ${err && err.stack ? err.stack : err}\n`)
    process.stdout.write(JSON.stringify({ ok: false, error: String(err && err.message ? err.message : err) }) + '\n')
    process.exit(1)
  })
