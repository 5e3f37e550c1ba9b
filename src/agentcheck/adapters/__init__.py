"""Framework glue: LangGraph, CrewAI and OpenAI Agents SDK adapters (one module each)."""
