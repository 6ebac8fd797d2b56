// Builds the corpus' Vercel AI SDK requests (tests/fixtures/clients/vercel-ai-sdk/) with the real, pinned packages:
//   cd tests/tools/vercel_ai_sdk && npm install --no-package-lock && node capture.mjs > /tmp/vercel.json
// streamText with a tool, then generateText sending back an assistant tool call and its result, over a recording fetch.
import { streamText, generateText, tool, jsonSchema } from 'ai'
import { createOpenAICompatible } from '@ai-sdk/openai-compatible'

const captured = []
const fetch = async (url, init) => {
  captured.push({ url: String(url), method: init.method, headers: Object.fromEntries(new Headers(init.headers)), body: JSON.parse(init.body) })
  return new Response(JSON.stringify({ error: { message: 'recorded' } }), { status: 500, headers: { 'content-type': 'application/json' } })
}
const provider = createOpenAICompatible({ name: 'edge', baseURL: 'http://server/v1', fetch, includeUsage: true })
const model = provider('qwen2.5-coder-0.5b-instruct-q4_k_m')
const tools = { get_weather: tool({ description: 'The current weather in a city.',
  inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }) }) }

const stream = streamText({ model, tools, maxRetries: 0, system: 'You are terse.', prompt: 'Weather in Paris?', onError: () => {} })
try { for await (const _ of stream.fullStream) {} } catch {}
try {
  await generateText({ model, tools, maxRetries: 0, messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: [{ type: 'text', text: 'Let me look.' },
      { type: 'tool-call', toolCallId: 'call_1', toolName: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call_1', toolName: 'get_weather',
      output: { type: 'json', value: { temperature: 18 } } }] },
  ] })
} catch {}
console.log(JSON.stringify(captured))
