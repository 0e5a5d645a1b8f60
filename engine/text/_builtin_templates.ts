/**
 * Built-in chat templates, used when a GGUF carries no `tokenizer.chat_template`.
 *
 * Written from spec/chat.md (not copied from a model repository); the ChatML frame, the tool header and
 * the tool-call literals are the byte-exact constants the models were trained on. Rendered through the same
 * Jinja interpreter as a file's own template, so both paths share one code path.
 * @module
 */

/**
 * Qwen3 (Qwen3-Next family) template: ChatML, Hermes-style JSON tool calls (§5.1, §5.2), earlier turns'
 * reasoning dropped and the current turn's kept (§5.3), generation prompt `<|im_start|>assistant\n`, plus
 * an empty think block when `enable_thinking` is false (the hybrid Qwen3 behaviour).
 */
export const QWEN3_TEMPLATE: string = [
  // §5.1: a leading system message is folded into the header; the tools block comes after it.
  "{%- set has_system = messages|length > 0 and messages[0].role == 'system' %}",
  "{%- if tools %}",
  "{{- '<|im_start|>system\\n' }}",
  "{%- if has_system %}{{- messages[0].content + '\\n\\n' }}{%- endif %}",
  "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" +
  "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}",
  "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}",
  "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments " +
  'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": ' +
  "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}",
  "{%- elif has_system %}",
  "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
  "{%- endif %}",
  // §5.3: the last real user query; tool results wrapped as user text do not count.
  "{%- set q = namespace(index=messages|length - 1, found=false) %}",
  "{%- for i in range(messages|length - 1, -1, -1) %}",
  "{%- set m = messages[i] %}",
  "{%- if not q.found and m.role == 'user' and not (m.content.startswith('<tool_response>') and " +
  "m.content.endswith('</tool_response>')) %}",
  "{%- set q.found = true %}{%- set q.index = i %}",
  "{%- endif %}",
  "{%- endfor %}",
  "{%- for m in messages %}",
  "{%- set i = loop.index0 %}",
  "{%- if m.role == 'user' or (m.role == 'system' and i > 0) %}",
  "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}",
  "{%- elif m.role == 'assistant' %}",
  "{%- set text = m.content %}",
  "{%- set thought = '' %}",
  "{%- if m.reasoning_content is string %}",
  "{%- set thought = m.reasoning_content %}",
  "{%- elif '</think>' in text %}",
  "{%- set thought = text.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}",
  "{%- set text = text.split('</think>')[-1].lstrip('\\n') %}",
  "{%- endif %}",
  "{%- if i > q.index and (loop.last or thought) %}",
  "{{- '<|im_start|>assistant\\n<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' + text.lstrip('\\n') }}",
  "{%- else %}",
  "{{- '<|im_start|>assistant\\n' + text }}",
  "{%- endif %}",
  "{%- for call in (m.tool_calls or []) %}",
  "{%- if not loop.first or text %}{{- '\\n' }}{%- endif %}",
  "{%- set fn = call.function if call.function else call %}",
  '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' }}',
  "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}",
  "{{- '}\\n</tool_call>' }}",
  "{%- endfor %}",
  "{{- '<|im_end|>\\n' }}",
  "{%- elif m.role == 'tool' %}",
  // §5.2: consecutive tool results share one user turn.
  "{%- if i == 0 or messages[i - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}",
  "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}",
  "{%- if loop.last or messages[i + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}",
  "{%- endif %}",
  "{%- endfor %}",
  "{%- if add_generation_prompt %}",
  "{{- '<|im_start|>assistant\\n' }}",
  "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}",
  "{%- endif %}",
].join("\n");

/** Converts text to a Jinja single-quoted string literal. */
function jinjaString(s: string): string {
  return "'" + s.replaceAll("\\", "\\\\").replaceAll("'", "\\'").replaceAll("\n", "\\n") + "'";
}

/** §6 tool-format instructions of the Qwen3.5 header (byte-exact model data). */
const QWEN35_TOOL_FORMAT = [
  "",
  "",
  "If you choose to call a function ONLY reply in the following format with NO suffix:",
  "",
  "<tool_call>",
  "<function=example_function_name>",
  "<parameter=example_parameter_1>",
  "value_1",
  "</parameter>",
  "<parameter=example_parameter_2>",
  "This is the value for the second parameter",
  "that can span",
  "multiple lines",
  "</parameter>",
  "</function>",
  "</tool_call>",
  "",
  "<IMPORTANT>",
  "Reminder:",
  "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags",
  "- Required parameters MUST be specified",
  "- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after",
  "- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls",
  "</IMPORTANT>",
].join("\n");

/**
 * Qwen3.5/3.6 template: ChatML, XML-style tool calls, system prompt after the tool block, trimmed contents,
 * the current turn's reasoning always in a think block, thinking on unless `enable_thinking` is false (§6).
 * Written from spec/chat.md §6; tool-call argument values follow the model's own template (objects and arrays
 * as JSON, other values through Python's `str`: `True`, `None`) where §6 simplifies to `tojson`.
 */
export const QWEN35_TEMPLATE: string = [
  "{%- if not messages %}{{- raise_exception('No messages provided.') }}{%- endif %}",
  "{%- set has_system = messages[0].role == 'system' %}",
  "{%- set system_text = (messages[0].content or '')|trim if has_system else '' %}",
  "{%- if tools %}",
  "{{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}",
  "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}",
  "{{- '\\n</tools>' }}",
  "{{- " + jinjaString(QWEN35_TOOL_FORMAT) + " }}",
  "{%- if system_text %}{{- '\\n\\n' + system_text }}{%- endif %}",
  "{{- '<|im_end|>\\n' }}",
  "{%- elif has_system %}",
  "{{- '<|im_start|>system\\n' + system_text + '<|im_end|>\\n' }}",
  "{%- endif %}",
  // The last user query: user text not wrapped as a tool response; a conversation without one is refused.
  "{%- set q = namespace(index=-1) %}",
  "{%- for i in range(messages|length - 1, -1, -1) %}",
  "{%- set m = messages[i] %}",
  "{%- set t = (m.content or '')|trim %}",
  "{%- if q.index < 0 and m.role == 'user' and not (t.startswith('<tool_response>') and " +
  "t.endswith('</tool_response>')) %}",
  "{%- set q.index = i %}",
  "{%- endif %}",
  "{%- endfor %}",
  "{%- if q.index < 0 %}{{- raise_exception('No user query found in messages.') }}{%- endif %}",
  "{%- for m in messages %}",
  "{%- set i = loop.index0 %}",
  "{%- set text = (m.content or '')|trim %}",
  "{%- if m.role == 'system' %}",
  "{%- if i > 0 %}{{- raise_exception('System message must be at the beginning.') }}{%- endif %}",
  "{%- elif m.role == 'user' %}",
  "{{- '<|im_start|>user\\n' + text + '<|im_end|>\\n' }}",
  "{%- elif m.role == 'assistant' %}",
  "{%- set thought = '' %}",
  "{%- if m.reasoning_content is string %}",
  "{%- set thought = m.reasoning_content %}",
  "{%- elif '</think>' in text %}",
  "{%- set thought = text.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}",
  "{%- set text = text.split('</think>')[-1].lstrip('\\n') %}",
  "{%- endif %}",
  "{%- set thought = thought|trim %}",
  "{%- if i > q.index %}",
  "{{- '<|im_start|>assistant\\n<think>\\n' + thought + '\\n</think>\\n\\n' + text }}",
  "{%- else %}",
  "{{- '<|im_start|>assistant\\n' + text }}",
  "{%- endif %}",
  "{%- for call in (m.tool_calls or []) %}",
  "{%- set fn = call.function if call.function else call %}",
  "{%- if loop.first %}{%- if text|trim %}{{- '\\n\\n' }}{%- endif %}{%- else %}{{- '\\n' }}{%- endif %}",
  "{{- '<tool_call>\\n<function=' + fn.name + '>\\n' }}",
  "{%- for key, value in fn.arguments|items %}",
  "{{- '<parameter=' + key + '>\\n' }}",
  // Objects and arrays as JSON, other values as Python's str() gives them (True, None), as the model's own
  // template renders them under transformers.
  "{%- if value is string %}{{- value }}",
  "{%- elif value is boolean %}{{- 'True' if value else 'False' }}",
  "{%- elif value is none %}{{- 'None' }}",
  "{%- elif value is mapping or value is sequence %}{{- value | tojson }}",
  "{%- else %}{{- value | string }}{%- endif %}",
  "{{- '\\n</parameter>\\n' }}",
  "{%- endfor %}",
  "{{- '</function>\\n</tool_call>' }}",
  "{%- endfor %}",
  "{{- '<|im_end|>\\n' }}",
  "{%- elif m.role == 'tool' %}",
  "{%- if i > 0 and messages[i - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}",
  "{{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' }}",
  "{%- if loop.last or messages[i + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}",
  "{%- else %}",
  "{{- raise_exception('Unexpected message role: ' + m.role) }}",
  "{%- endif %}",
  "{%- endfor %}",
  "{%- if add_generation_prompt %}",
  "{{- '<|im_start|>assistant\\n' }}",
  "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}" +
  "{%- else %}{{- '<think>\\n' }}{%- endif %}",
  "{%- endif %}",
].join("\n");
