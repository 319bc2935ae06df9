package chat

import (
	"strings"
	"unicode"

	"github.com/infermesh/infermesh/node/engine"
)

// Text of the tools section Qwen2.5's template writes into the system
// message (the Hermes function-calling convention).
const (
	defaultSystem = "You are a helpful assistant."
	toolsIntro    = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
	toolsOutro    = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
)

// toolsSection renders the tool list as Qwen2.5's template does.
func toolsSection(tools []engine.Tool) string {
	var b strings.Builder
	b.WriteString(toolsIntro)
	for _, t := range templateTools(tools) {
		b.WriteByte('\n')
		_ = writePyJSON(&b, t, defaultJSONOpts(), 0)
	}
	b.WriteString(toolsOutro)
	return b.String()
}

// toolCallBlocks renders assistant tool calls as <tool_call> blocks, each
// preceded by a newline.
func toolCallBlocks(calls []engine.ToolCall) string {
	var b strings.Builder
	for _, c := range calls {
		b.WriteString("\n<tool_call>\n{\"name\": \"")
		b.WriteString(c.Name)
		b.WriteString("\", \"arguments\": ")
		args, ok := jsonValue([]byte(c.Arguments))
		if !ok {
			args = c.Arguments
		}
		_ = writePyJSON(&b, args, defaultJSONOpts(), 0)
		b.WriteString("}\n</tool_call>")
	}
	return b.String()
}

func normRole(role string) string {
	if role == engine.RoleDeveloper {
		return engine.RoleSystem
	}
	return role
}

// renderChatML is Qwen2.5-Instruct's chat template, written out in Go: the
// same text for the same conversation (the tests render both and compare).
func renderChatML(msgs []engine.ChatMessage, tools []engine.Tool, addGenerationPrompt bool) string {
	var b strings.Builder
	firstSystem := len(msgs) > 0 && normRole(msgs[0].Role) == engine.RoleSystem
	system := defaultSystem
	if firstSystem {
		system = msgs[0].Content
	}
	b.WriteString("<|im_start|>system\n")
	b.WriteString(system)
	if len(tools) > 0 {
		b.WriteString("\n\n")
		b.WriteString(toolsSection(tools))
	}
	b.WriteString("<|im_end|>\n")
	for i, m := range msgs {
		role := normRole(m.Role)
		switch {
		case role == engine.RoleUser || role == engine.RoleSystem && i > 0 || role == engine.RoleAssistant && len(m.ToolCalls) == 0:
			b.WriteString("<|im_start|>" + role + "\n" + m.Content + "<|im_end|>\n")
		case role == engine.RoleAssistant:
			b.WriteString("<|im_start|>assistant")
			if m.Content != "" {
				b.WriteString("\n" + m.Content)
			}
			b.WriteString(toolCallBlocks(m.ToolCalls))
			b.WriteString("<|im_end|>\n")
		case role == engine.RoleTool:
			if i == 0 || normRole(msgs[i-1].Role) != engine.RoleTool {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n" + m.Content + "\n</tool_response>")
			if i == len(msgs)-1 || normRole(msgs[i+1].Role) != engine.RoleTool {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

// renderLlama3 is Llama 3 Instruct's chat template: bos, then each message
// as <|start_header_id|>role<|end_header_id|>\n\n + trimmed content +
// <|eot_id|>. Llama 3's template has no tools; here tools are described in
// the system message and calls written as <tool_call> blocks, the Hermes
// convention the engine parses (an infermesh choice, see DESIGN.md).
func renderLlama3(msgs []engine.ChatMessage, tools []engine.Tool, addGenerationPrompt bool, bos string) string {
	if len(tools) > 0 {
		section := toolsSection(tools)
		if len(msgs) > 0 && normRole(msgs[0].Role) == engine.RoleSystem {
			first := msgs[0]
			first.Content = strings.TrimSpace(first.Content) + "\n\n" + section
			msgs = append([]engine.ChatMessage{first}, msgs[1:]...)
		} else {
			msgs = append([]engine.ChatMessage{{Role: engine.RoleSystem, Content: section}}, msgs...)
		}
	}
	var b strings.Builder
	b.WriteString(bos)
	for _, m := range msgs {
		content := m.Content
		if len(m.ToolCalls) > 0 {
			content += toolCallBlocks(m.ToolCalls)
		}
		b.WriteString("<|start_header_id|>" + normRole(m.Role) + "<|end_header_id|>\n\n")
		b.WriteString(strings.TrimFunc(content, unicode.IsSpace))
		b.WriteString("<|eot_id|>")
	}
	if addGenerationPrompt {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return b.String()
}
