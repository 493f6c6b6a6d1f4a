#!/usr/bin/env node
// kafkajs 2.2.4 consumer group against an oncelog broker; driven by
// tests/integration/test_kafkajs_groups.py.
//
//   node group.js BOOTSTRAP TOPIC GROUP COUNT
//       a kafkajs Consumer joins GROUP (FindCoordinator, JoinGroup, SyncGroup,
//       Heartbeat), reads COUNT records of TOPIC from the committed offsets
//       (or the beginning), commits the next offset of every partition it
//       read (OffsetCommit), then reports what admin.fetchOffsets (OffsetFetch)
//       and admin.describeGroups (DescribeGroups) say before and after the
//       consumer disconnects (LeaveGroup).
//
// Prints one JSON summary line on stdout (kafkajs logs go to stderr).
'use strict'

const { Kafka, logLevel } = require('kafkajs')

const DEADLINE_MS = Number(process.env.GROUP_DEADLINE_MS || 60000)
const watchdog = setTimeout(() => {
  process.stderr.write(`group.js: deadline of ${DEADLINE_MS} ms exceeded\n`)
  process.exit(3)
}, DEADLINE_MS)

const stderrLogger = () => ({ namespace, label, log }) => {
  const { message, ...extra } = log
  process.stderr.write(`[kafkajs ${label} ${namespace}] ${message} ${JSON.stringify(extra)}\n`)
}

async function consume(bootstrap, topic, groupId, count) {
  const kafka = new Kafka({
    clientId: 'oncelog-kafkajs-group',
    brokers: [bootstrap],
    logLevel: logLevel.WARN,
    logCreator: stderrLogger,
    connectionTimeout: 5000,
    requestTimeout: 15000,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
  })
  const consumer = kafka.consumer({
    groupId, sessionTimeout: 6000, heartbeatInterval: 500, rebalanceTimeout: 10000, maxWaitTimeInMs: 500,
  })
  const admin = kafka.admin()
  const summary = { records: [], joins: [] }
  consumer.on(consumer.events.GROUP_JOIN, e => {
    summary.joins.push({
      memberId: e.payload.memberId,
      leaderId: e.payload.leaderId,
      isLeader: e.payload.isLeader,
      groupProtocol: e.payload.groupProtocol,
      assignment: e.payload.memberAssignment,
    })
  })
  await admin.connect()
  await consumer.connect()
  try {
    await consumer.subscribe({ topic, fromBeginning: true })
    let done
    const allRead = new Promise(resolve => { done = resolve })
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        summary.records.push({ partition, offset: Number(message.offset), value: message.value.toString() })
        if (summary.records.length >= count) done()
      },
    })
    await allRead
    const next = {}
    for (const r of summary.records) next[r.partition] = Math.max(next[r.partition] ?? 0, r.offset + 1)
    summary.committed = next
    await consumer.commitOffsets(Object.entries(next).map(([partition, offset]) => (
      { topic, partition: Number(partition), offset: String(offset) })))
    summary.fetched = (await admin.fetchOffsets({ groupId, topics: [topic] }))[0].partitions
      .map(p => ({ partition: p.partition, offset: Number(p.offset) }))
      .sort((a, b) => a.partition - b.partition)
    const described = (await admin.describeGroups([groupId])).groups[0]
    summary.describedWhileMember = {
      state: described.state,
      protocolType: described.protocolType,
      protocol: described.protocol,
      members: described.members.map(m => m.memberId),
    }
  } finally {
    await consumer.disconnect()
  }
  const after = (await admin.describeGroups([groupId])).groups[0]
  summary.describedAfterLeave = { state: after.state, members: after.members.length }
  await admin.disconnect()
  return summary
}

async function main() {
  const [bootstrap, topic, group, count] = process.argv.slice(2)
  if (!bootstrap || !topic || !group) throw new Error('usage: group.js BOOTSTRAP TOPIC GROUP COUNT')
  const summary = await consume(bootstrap, topic, group, Number(count || 10))
  summary.ok = true
  process.stdout.write(JSON.stringify(summary) + '\n')
}

main()
  .then(() => {
    clearTimeout(watchdog)
    process.exit(0)
  })
  .catch(err => {
    process.stderr.write(`group.js failed: ${err && err.stack ? err.stack : err}\n`)
    process.stdout.write(JSON.stringify({ ok: false, error: String(err && err.message ? err.message : err) }) + '\n')
    process.exit(1)
  })
