"""The structured output sample: extraction and classification with JSON Schemas, and
JSON mode; written by hand, no downloads.

- 22 extraction prompts: a short text (invoice, job post, review, ticket, recipe, meeting notes,
  address, event, bug report, email, flight booking, ...) and an OpenAI strict-mode JSON Schema
  (`response_format.type == "json_schema"`, `strict: true`) for the facts to pull out of it;
  three of the schemas nest objects or arrays of objects.
- 12 classification prompts: a short text and a strict-mode schema whose label is an `enum`
  (sentiment, ticket priority, topic, language, spam, ...), some with a short "reason".
- 10 JSON mode prompts: `response_format.type == "json_object"`, the keys named in the user
  message.
- 18 tool prompts over six function tools (weather, stock price, e-mail, currency, calendar,
  flights), each with the tools it should call written down (`expected_tools`, empty when the
  right answer is text): single calls with `tool_choice` auto and required, a named tool,
  parallel calls, questions no tool answers, and multi-turn conversations that carry a tool's
  result (answered in text, or by a second call).

Every schema is an object with all its properties required and `additionalProperties: false`
at every object level; no `$ref`, `format`, `pattern` or length bounds. Answers are small: a
1.5B model's answer should fit in about 200 tokens.

Usage: python3 make_prompts.py   (writes prompts.jsonl next to this file; deterministic)
"""
import json
import os

S = {"type": "string"}
I = {"type": "integer"}
N = {"type": "number"}
B = {"type": "boolean"}


def arr(items):
    return {"type": "array", "items": items}


def enum(*labels):
    return {"type": "string", "enum": list(labels)}


def obj(**props):
    """A strict-mode object: every property required, no other properties."""
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


EXTRACT_SYSTEM = ("Extract the requested data from the user's text as JSON. Use only facts stated "
                  "in the text; copy names, dates and amounts as written.")
CLASSIFY_SYSTEM = "Classify the text. Answer as JSON."
JSON_MODE_SYSTEM = "You answer only with a single JSON object, nothing else."

# (schema name, text, schema)
EXTRACTION = [
    ("contact_card",
     "Hi, I'm Laura Bennett, the office manager at Greenfield Dental. You can reach me at "
     "laura.bennett@greenfielddental.com or on 555-0142.",
     obj(name=S, job_title=S, company=S, email=S, phone=S)),
    ("invoice",  # nested: array of line-item objects
     "INVOICE #INV-2291 from Northwind Supplies, dated 14 March 2024, billed to Harbor Cafe. "
     "Items: 3 boxes of paper cups at 12.50 each, 2 bags of coffee beans at 18.00 each, and "
     "1 milk frother at 45.99. Total due: 118.49 USD by 13 April 2024.",
     obj(invoice_number=S, seller=S, buyer=S, issue_date=S, due_date=S, currency=S,
         line_items=arr(obj(description=S, quantity=I, unit_price=N)), total=N)),
    ("job_post",
     "Brightline Analytics is hiring a Senior Data Engineer in Lisbon, Portugal. The role is "
     "full-time and hybrid, with two office days a week. Salary range: 60,000 to 75,000 EUR per "
     "year. Requirements: 5+ years of experience with Python and SQL. Apply by 30 June 2024.",
     obj(company=S, job_title=S, city=S, country=S, employment_type=S, remote_policy=S,
         salary_min=I, salary_max=I, salary_currency=S, min_years_experience=I,
         skills=arr(S), application_deadline=S)),
    ("product_review",
     "I bought the AeroBrew X2 kettle for 79 dollars. It boils fast and looks great, but the lid "
     "started squeaking after a month. I'd give it 3 out of 5 stars.",
     obj(product_name=S, price=N, rating=I, rating_scale=I, pros=arr(S), cons=arr(S))),
    ("support_ticket",
     "Ticket #58213 opened by Marco Ruiz (account ID AC-7741) on 2 May 2024: the mobile app "
     "crashes every time he tries to upload a profile photo on his Pixel 7 running Android 14.",
     obj(ticket_id=S, customer_name=S, account_id=S, date_opened=S, product_area=S,
         device=S, os_version=S, summary=S)),
    ("recipe",  # nested: array of ingredient objects
     "Easy pancakes (serves 4): whisk 200 g flour, 2 eggs, 300 ml milk and 1 tbsp sugar into a "
     "smooth batter. Cook on a hot pan for about 2 minutes per side. Total time is 20 minutes.",
     obj(title=S, servings=I, total_minutes=I,
         ingredients=arr(obj(name=S, amount=N, unit=S)), step_count=I)),
    ("meeting_notes",  # nested: attendee list and array of action-item objects
     "Product sync, Tuesday 9 April 2024. Present: Anna, Ben, Chloe. We agreed to move the launch "
     "to 20 May. Action items: Anna will update the roadmap by Friday; Ben will brief the sales "
     "team by 15 April; Chloe will fix the pricing page copy by 12 April.",
     obj(meeting_title=S, date=S, attendees=arr(S), decisions=arr(S),
         action_items=arr(obj(owner=S, task=S, due=S)))),
    ("postal_address",
     "Please ship the order to Mr. Daniel Okafor, 42 Elm Street, Apartment 5B, Springfield, "
     "IL 62704, USA.",
     obj(recipient=S, street=S, unit=S, city=S, state=S, postal_code=S, country=S)),
    ("event",
     "Join us for the Riverside Jazz Night on Saturday, 22 June 2024, from 7 pm to 11 pm at "
     "Harbor Hall, 10 Dock Road. Tickets cost 25 dollars, children under 12 get in free. "
     "All proceeds go to the city music school.",
     obj(event_name=S, date=S, start_time=S, end_time=S, venue=S, address=S,
         ticket_price=N, free_for_children=B, beneficiary=S)),
    ("bug_report",
     "Bug: in version 3.2.1 of the web dashboard, clicking 'Export CSV' on the Reports page "
     "downloads an empty file. It happens in Firefox 125 but not in Chrome. Expected: a CSV with "
     "all rows in the current filter. Severity: major.",
     obj(title=S, software_version=S, page=S, steps=arr(S), expected_result=S,
         actual_result=S, affected_browsers=arr(S), unaffected_browsers=arr(S), severity=S)),
    ("email_request",
     "From: Priya Shah. To: facilities team. Subject: Broken projector in Room 4.12. Hi all, the "
     "projector in Room 4.12 won't turn on. Could someone look at it before my 10:00 workshop on "
     "Thursday? Thanks, Priya.",
     obj(sender=S, recipient=S, subject=S, room=S, problem=S, deadline=S, is_urgent=B)),
    ("flight_booking",
     "Booking confirmed: passenger Emma Larsen, flight SK 1455 from Copenhagen (CPH) to "
     "Amsterdam (AMS) on 3 July 2024, departing 08:35 and arriving 10:05. Seat 14C, economy "
     "class, booking reference QX7T2M. One checked bag included.",
     obj(passenger=S, flight_number=S, origin_airport=S, destination_airport=S, date=S,
         departure_time=S, arrival_time=S, seat=S, cabin_class=S, booking_reference=S,
         checked_bags=I)),
    ("hotel_reservation",
     "Your stay at the Alpine Lodge is booked: check-in 12 February 2025, check-out "
     "15 February 2025, 2 adults, one double room with breakfast. The total is 540 CHF.",
     obj(hotel=S, check_in=S, check_out=S, nights=I, adults=I, room_type=S,
         breakfast_included=B, total_price=N, currency=S)),
    ("order_status",
     "Your order #A-99012 has shipped via DHL. Tracking number: 1Z84736. Estimated delivery: "
     "Monday 8 July 2024.",
     obj(order_id=S, carrier=S, tracking_number=S, estimated_delivery=S)),
    ("person_bio",
     "Dr. Helen Cho was born in 1978 in Busan. She studied chemistry at Seoul National "
     "University and now leads a battery research lab at the Technical University of Munich. "
     "She speaks Korean, English and German.",
     obj(name=S, title=S, birth_year=I, birthplace=S, field_of_study=S, university=S,
         current_employer=S, languages=arr(S))),
    ("apartment_listing",
     "For rent: bright 2-bedroom apartment, 68 square meters, third floor with elevator, in the "
     "Mitte district of Berlin. Rent is 1,350 EUR per month plus 200 EUR utilities. "
     "Pets allowed, available from 1 September.",
     obj(bedrooms=I, area_sqm=I, floor=I, has_elevator=B, district=S, city=S, rent=N,
         utilities=N, currency=S, pets_allowed=B, available_from=S)),
    ("medication",
     "Take amoxicillin 500 mg three times a day for 7 days, with food.",
     obj(drug=S, dose_mg=I, times_per_day=I, duration_days=I, with_food=B)),
    ("car_listing",
     "Selling my 2018 Toyota Corolla, silver, 84,000 km, automatic, one owner. "
     "Asking 13,900 dollars. Call Tom at 555-0199.",
     obj(year=I, make=S, model=S, color=S, mileage_km=I, transmission=S, owners=I,
         price=N, seller_name=S, seller_phone=S)),
    ("bank_transaction",
     "On 28 May 2024 you paid 64.30 GBP to Tesco Stores with your debit card ending in 4821.",
     obj(date=S, amount=N, currency=S, merchant=S, payment_method=S, card_last_four=S)),
    ("course_info",
     "Intro to Statistics (STAT 101) is taught by Prof. Miguel Alvarez on Mondays and Wednesdays "
     "at 9:00 in Room B204. The course is worth 4 credits and starts on 2 September 2024.",
     obj(course_title=S, course_code=S, instructor=S, days=arr(S), time=S, room=S,
         credits=I, start_date=S)),
    ("weather_report",
     "Tomorrow in Oslo: light snow in the morning, a high of -2 degrees Celsius and a low of "
     "-8, with winds of 15 km/h from the north.",
     obj(city=S, conditions=S, high_celsius=I, low_celsius=I, wind_kmh=I, wind_direction=S)),
    ("sports_result",
     "The Lakeside Tigers beat the Hillcrest Falcons 3-1 on Sunday. Maya Ortiz scored twice for "
     "the Tigers, and the attendance was 4,200.",
     obj(winner=S, loser=S, winner_score=I, loser_score=I, day=S, top_scorer=S,
         top_scorer_goals=I, attendance=I)),
]

# (schema name, instruction, text, schema)
CLASSIFICATION = [
    ("review_sentiment", "Classify the sentiment of this product review.",
     "The headphones arrived a day early, sound amazing and the battery lasts all week. "
     "Best purchase this year.",
     obj(sentiment=enum("positive", "negative", "neutral"), reason=S)),
    ("review_sentiment", "Classify the sentiment of this product review.",
     "The blender stopped working after two uses and support never answered my emails.",
     obj(sentiment=enum("positive", "negative", "neutral"), reason=S)),
    ("review_sentiment", "Classify the sentiment of this restaurant review.",
     "The pasta was fine. Service was average, prices were normal for the area. "
     "Nothing stood out either way.",
     obj(sentiment=enum("positive", "negative", "neutral"), reason=S)),
    ("ticket_priority", "Assign a priority to this support ticket.",
     "Our whole checkout is down, no customer can pay since 9:40 this morning. "
     "We are losing sales every minute, please help now!",
     obj(priority=enum("low", "medium", "high"), reason=S)),
    ("ticket_priority", "Assign a priority to this support ticket.",
     "Small thing: the footer of your help page still says 2022. No rush at all.",
     obj(priority=enum("low", "medium", "high"), reason=S)),
    ("ticket_priority", "Assign a priority to this support ticket.",
     "Exporting reports to PDF fails for one of our users. The others can still export, "
     "and she can use CSV in the meantime, but we need it fixed this week.",
     obj(priority=enum("low", "medium", "high"), reason=S)),
    ("news_topic", "Assign a topic to this news headline and sentence.",
     "Central bank raises interest rates by 0.25 points. The decision aims to slow inflation, "
     "which reached 4.1 percent last month.",
     obj(topic=enum("politics", "business", "sports", "technology", "health", "entertainment"),
         confidence=enum("low", "medium", "high"))),
    ("news_topic", "Assign a topic to this news headline and sentence.",
     "New smartphone chip doubles battery life. The manufacturer says the first phones using it "
     "will ship in the autumn.",
     obj(topic=enum("politics", "business", "sports", "technology", "health", "entertainment"),
         confidence=enum("low", "medium", "high"))),
    ("sentence_language", "Identify the language of this sentence.",
     "Je voudrais réserver une table pour deux personnes ce soir.",
     obj(language=enum("english", "french", "german", "spanish", "italian", "portuguese",
                       "dutch", "other"),
         confidence=enum("low", "medium", "high"))),
    ("sentence_language", "Identify the language of this sentence.",
     "Können Sie mir bitte sagen, wo der Bahnhof ist?",
     obj(language=enum("english", "french", "german", "spanish", "italian", "portuguese",
                       "dutch", "other"),
         confidence=enum("low", "medium", "high"))),
    ("spam_check", "Decide whether this email is spam.",
     "CONGRATULATIONS!!! You have WON a 1000 dollar gift card. Click the link within 24 hours "
     "and enter your bank details to claim your prize.",
     obj(is_spam=B, category=enum("phishing", "advertising", "scam", "legitimate"),
         confidence=enum("low", "medium", "high"))),
    ("email_intent", "Classify the intent of this customer email.",
     "Hello, I was charged twice for my March subscription. Could you refund the extra "
     "payment of 9.99 to my card? Thanks.",
     obj(intent=enum("billing", "technical_support", "cancellation", "sales_inquiry",
                     "feedback", "other"),
         requires_refund=B, reason=S)),
]

# (user message): text followed by which keys to produce
JSON_MODE = [
    "Paris is the capital and largest city of France, with about 2.1 million residents. "
    "Answer as a JSON object with keys 'city' and 'country'.",
    "Text: \"Meet me at the Blue Door cafe on Friday at 6:30 pm.\" Answer as a JSON object with "
    "keys 'place', 'day' and 'time'.",
    "Convert this into JSON: the book 'The Silent River' by Anna Keller was published in 2019 "
    "and has 312 pages. Answer as a JSON object with keys 'title', 'author', 'year' (a number) "
    "and 'pages' (a number).",
    "Sam ordered two lattes at 4.20 each and one croissant at 3.10. Answer as a JSON object with "
    "keys 'items' (a list of item names), 'item_count' (a number) and 'total' (a number).",
    "Decide whether the following sentence is a question: \"The train leaves at noon.\" Answer as "
    "a JSON object with keys 'is_question' (true or false) and 'reason'.",
    "List three primary colors. Answer as a JSON object with the single key 'colors', "
    "whose value is a list of strings.",
    "Our team has four members: Lena (designer), Omar (backend developer), Kim (frontend "
    "developer) and Raj (product manager). Answer as a JSON object with the key 'members', a "
    "list of objects each with keys 'name' and 'role'.",
    "The temperature in Madrid is 31 degrees Celsius. Convert it to Fahrenheit. Answer as a JSON "
    "object with keys 'celsius' and 'fahrenheit' (both numbers).",
    "Summarize this note in one sentence: \"The quarterly review moved from Monday to Wednesday "
    "because the CFO is travelling. Please bring the updated sales figures.\" Answer as a JSON "
    "object with keys 'summary', 'new_day' and 'things_to_bring' (a list of strings).",
    "Give the word count and the number of sentences of this text: \"Dogs bark. Cats purr "
    "softly.\" Answer as a JSON object with keys 'words' and 'sentences' (both numbers).",
]


def tool(name, description, **props):
    return {"type": "function", "function": {
        "name": name, "description": description, "parameters": obj(**props)}}


TOOLS = [
    tool("get_weather", "Current weather in a city.",
         city=S, unit=enum("celsius", "fahrenheit")),
    tool("get_stock_price", "Latest price of a stock by its ticker symbol.", symbol=S),
    tool("send_email", "Send an e-mail.", to=S, subject=S, body=S),
    tool("convert_currency", "Convert an amount of money between currencies (ISO codes).",
         amount=N, from_currency=S, to_currency=S),
    tool("create_event", "Add an event to the user's calendar.", title=S, date=S, time=S),
    tool("search_flights", "Search flights between two cities on a date.",
         origin=S, destination=S, date=S),
]
TOOL_SYSTEM = "You are a helpful assistant. Use the tools when they help answer the user."


def call(name, **args):
    return {"id": f"call_{name}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def result_turn(user, calls, results):
    """A conversation where the assistant called tools and their results came back."""
    turn = [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": user},
            {"role": "assistant", "content": None, "tool_calls": calls}]
    for c, r in zip(calls, results):
        turn.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(r)})
    return turn


# (kind, messages or user text, tool_choice, parallel_tool_calls, expected tools)
TOOL_PROMPTS = [
    ("tool_auto", "What's the weather like in Oslo right now?", "auto", False, ["get_weather"]),
    ("tool_auto", "How much is Apple stock (AAPL) trading at?", "auto", False,
     ["get_stock_price"]),
    ("tool_auto", "Convert 250 US dollars to euros.", "auto", False, ["convert_currency"]),
    ("tool_auto", "Find me flights from Boston to Denver on 12 May 2025.", "auto", False,
     ["search_flights"]),
    ("tool_auto", "Write a haiku about autumn leaves.", "auto", False, []),
    ("tool_auto", "What is the capital of Australia?", "auto", False, []),
    ("tool_required", "Email sam@example.com with the subject 'Lunch' and say I'll be ten "
     "minutes late.", "required", False, ["send_email"]),
    ("tool_required", "Put a dentist appointment in my calendar on 3 June 2025 at 9:30.",
     "required", False, ["create_event"]),
    ("tool_required", "Is it raining in Seattle? Answer in fahrenheit.", "required", False,
     ["get_weather"]),
    ("tool_required", "What does one share of Microsoft (MSFT) cost?", "required", False,
     ["get_stock_price"]),
    ("tool_named", "I need to get from Rome to Madrid on 2 July 2025.",
     {"type": "function", "function": {"name": "search_flights"}}, False, ["search_flights"]),
    ("tool_parallel", "What's the weather in Paris and in Berlin?", "required", True,
     ["get_weather", "get_weather"]),
    ("tool_parallel", "Get me the stock prices of NVDA and TSLA.", "required", True,
     ["get_stock_price", "get_stock_price"]),
    ("tool_parallel", "Convert 100 GBP to USD, and tell me the weather in London.", "required",
     True, ["convert_currency", "get_weather"]),
    ("tool_result", result_turn("What's the weather in Oslo right now?",
                                [call("get_weather", city="Oslo", unit="celsius")],
                                [{"temperature": 4, "sky": "light rain"}]), "auto", False, []),
    ("tool_result", result_turn("How much is 80 euros in Japanese yen?",
                                [call("convert_currency", amount=80, from_currency="EUR",
                                      to_currency="JPY")],
                                [{"amount": 12960.0, "currency": "JPY"}]), "auto", False, []),
    ("tool_result", result_turn("Compare the prices of AMZN and GOOG.",
                                [call("get_stock_price", symbol="AMZN"),
                                 call("get_stock_price", symbol="GOOG")],
                                [{"symbol": "AMZN", "price": 186.4},
                                 {"symbol": "GOOG", "price": 171.2}]), "auto", False, []),
    ("tool_result", result_turn("Find a flight from Lisbon to Prague on 9 August 2025 and put "
                                "it in my calendar.",
                                [call("search_flights", origin="Lisbon", destination="Prague",
                                      date="2025-08-09")],
                                [{"flights": [{"number": "TP1234", "departs": "07:40"}]}]),
     "required", False, ["create_event"]),
]


def messages(system, user):
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def schema_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def rows():
    for i, (name, text, schema) in enumerate(EXTRACTION, 1):
        yield {"id": f"extraction-{i:02d}", "kind": "extraction",
               "messages": messages(EXTRACT_SYSTEM, text),
               "response_format": schema_format(name, schema)}
    for i, (name, ask, text, schema) in enumerate(CLASSIFICATION, 1):
        yield {"id": f"classification-{i:02d}", "kind": "classification",
               "messages": messages(CLASSIFY_SYSTEM, f"{ask}\n\nText: {text}"),
               "response_format": schema_format(name, schema)}
    for i, user in enumerate(JSON_MODE, 1):
        yield {"id": f"json-mode-{i:02d}", "kind": "json_mode",
               "messages": messages(JSON_MODE_SYSTEM, user),
               "response_format": {"type": "json_object"}}
    for i, (kind, conversation, choice, parallel, expected) in enumerate(TOOL_PROMPTS, 1):
        if isinstance(conversation, str):
            conversation = messages(TOOL_SYSTEM, conversation)
        yield {"id": f"tools-{i:02d}", "kind": kind, "messages": conversation, "tools": TOOLS,
               "tool_choice": choice, "parallel_tool_calls": parallel,
               "expected_tools": expected}


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.jsonl")
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for row in rows():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
