-- the two hot queries of the dashboard (:user is bound by the application)
SELECT count(*), max(created_at) FROM events WHERE user_id = :user AND kind = 'purchase';
SELECT id, kind, created_at FROM events WHERE user_id = :user ORDER BY created_at DESC LIMIT 10;
